"""Loading released checkpoints: layouts, safety, reports, the offline converter."""
import collections
import subprocess
import sys

import pytest
import torch

from helpers.fidelity import FAMILIES, backbone_cfg, load_fixture
from helpers.paths import REPO
from mmplugin_inline.registry import MODELS
from mmplugin_inline.weights import (
    SetAside,
    convert_state_dict,
    detect_family,
    dropped_entries,
    load_weights,
    unwrap_state_dict,
)
from mmplugin_inline.weights.convert import CLASSIFIER

ROOT = REPO


def _outputs(family, path, **kw):
    fixture = load_fixture(family)
    cfg = backbone_cfg(family, fixture['arch'], **kw)
    cfg['init_cfg'] = dict(type='Pretrained', checkpoint=str(path))
    model = MODELS.build(cfg)
    model.init_weights()
    with torch.no_grad():
        return model.eval()(fixture['cases'][0]['input']), fixture


def _variants(state_dict):
    prefixed = lambda p: collections.OrderedDict((p + k, v) for k, v in state_dict.items())  # noqa
    return {
        'released': {'model': state_dict},
        'state_dict': {'state_dict': state_dict, 'meta': {}},
        'module': {'model': prefixed('module.')},
        'backbone': {'state_dict': prefixed('backbone.')},
        'bare': state_dict,
    }


@pytest.mark.parametrize('layout', ['released', 'state_dict', 'module', 'backbone', 'bare'])
def test_every_supported_layout_loads_to_the_same_outputs(layout, tmp_path):
    fixture = load_fixture('swin')
    path = tmp_path / 'ckpt.pth'
    torch.save(_variants(fixture['checkpoint']['model'])[layout], path)
    outs, _ = _outputs('swin', path, out_norm=False)
    for ours, theirs in zip(outs, fixture['cases'][0]['stage_outputs']):
        assert (ours - theirs).abs().max() <= 1e-4


def test_a_checkpoint_of_another_family_is_an_error_naming_it(tmp_path):
    path = tmp_path / 'swin.pth'
    torch.save(load_fixture('swin')['checkpoint'], path)
    with pytest.raises(RuntimeError, match='looks like an InLineSwinTransformer checkpoint'):
        _outputs('pvt', path)


def test_a_checkpoint_of_another_size_is_an_error(tmp_path):
    path = tmp_path / 'pvt.pth'
    torch.save(load_fixture('pvt')['checkpoint'], path)
    fixture = load_fixture('pvt')
    cfg = backbone_cfg('pvt', fixture['arch'])
    cfg['arch']['embed_dims'] = [32, 64, 96, 128]
    cfg['init_cfg'] = dict(type='Pretrained', checkpoint=str(path))
    with pytest.raises(RuntimeError, match='another arch / size'):
        MODELS.build(cfg).init_weights()


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match='nowhere.pth'):
        load_weights(str(tmp_path / 'nowhere.pth'))


class _Payload:
    """An arbitrary Python object: unpickling it would run code from the file."""


def test_files_with_python_objects_load_as_data_and_the_opt_in_still_unpickles(tmp_path):
    path = tmp_path / 'with_objects.pth'
    torch.save({'model': load_fixture('deit')['checkpoint']['model'], 'extra': _Payload()}, path)
    assert isinstance(load_weights(str(path))['extra'], SetAside)  # no opt-in needed
    assert isinstance(load_weights(str(path), allow_unsafe=True)['extra'], _Payload)
    fixture = load_fixture('deit')
    cfg = backbone_cfg('deit', fixture['arch'])
    for allow_unsafe in (False, True):
        cfg['init_cfg'] = dict(type='Pretrained', checkpoint=str(path), allow_unsafe=allow_unsafe)
        model = MODELS.build(cfg)
        model.init_weights()
        with torch.no_grad():
            out = model.eval()(fixture['cases'][0]['input'])
        assert (out[-1] - fixture['cases'][0]['stage_outputs'][-1]).abs().max() <= 1e-4


def test_unwrap_and_detect():
    sd = load_fixture('cswin')['checkpoint']['model']
    assert detect_family(unwrap_state_dict({'model': sd})) == 'InLineCSWinTransformer'
    assert detect_family({'foo.weight': torch.zeros(1)}) is None
    with pytest.raises(ValueError, match='no tensors'):
        unwrap_state_dict({'model': {'epoch': 3}})


@pytest.mark.parametrize('family', FAMILIES)
def test_each_family_is_detected_from_its_released_layout(family):
    fixture = load_fixture(family)
    assert detect_family(unwrap_state_dict(fixture['checkpoint'])) == \
        backbone_cfg(family, fixture['arch'])['type']


@pytest.mark.parametrize('family', ['cswin', 'pvt'])
def test_offline_converter_cli(family, tmp_path):
    fixture = load_fixture(family)
    src, dst = tmp_path / 'released.pth', tmp_path / 'converted.pth'
    torch.save(fixture['checkpoint'], src)
    res = subprocess.run([sys.executable, 'tools/model_converters/inline2mm.py', str(src),
                          str(dst)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert 'checkpoint' in res.stdout and 'head.weight' in res.stdout
    converted = torch.load(dst, weights_only=True)
    assert not any(k.startswith('head.') for k in converted['state_dict'])
    outs, fx = _outputs(family, dst, out_norm=False)
    for ours, theirs in zip(outs, fx['cases'][0]['stage_outputs']):
        assert (ours - theirs).abs().max() <= 1e-4


def test_converter_cli_reads_files_with_python_objects_as_data(tmp_path):
    src = tmp_path / 'with_objects.pth'
    torch.save({'model': load_fixture('deit')['checkpoint']['model'], 'x': _Payload()}, src)
    cmd = [sys.executable, 'tools/model_converters/inline2mm.py', str(src), str(tmp_path / 'o.pth')]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert 'ignored (not weights): x (test_checkpoint._Payload)' in res.stdout
    assert (tmp_path / 'o.pth').exists()


def test_relative_position_tables_are_resampled_bicubically_to_another_window(tmp_path):
    """A released window-7 table (13 x 13 per head) into ``window_size=12`` (23 x 23)."""
    import torch.nn.functional as F
    fixture = load_fixture('swin')
    path = tmp_path / 'swin.pth'
    torch.save(fixture['checkpoint'], path)
    cfg = backbone_cfg('swin', fixture['arch'], window_size=12)
    cfg['init_cfg'] = dict(type='Pretrained', checkpoint=str(path))
    model = MODELS.build(cfg)
    model.init_weights()
    released = fixture['checkpoint']['model']
    # the model's tables under their released names (the keys of release 0.1, upgraded)
    names = dict(zip(released, model.upgrade_legacy_keys(dict.fromkeys(released), model=model)))
    own = {k: model.state_dict()[names[k]] for k in released
           if k.endswith('relative_position_bias_table')}
    tables = [k for k in released if k.endswith('relative_position_bias_table')]
    assert tables
    for key in tables:
        heads = released[key].shape[1]
        grid = released[key].t().reshape(1, heads, 13, 13)       # [heads, dy, dx] as an image
        expected = F.interpolate(grid, size=(23, 23), mode='bicubic', align_corners=False)
        assert own[key].shape == (23 * 23, heads)
        torch.testing.assert_close(own[key], expected.reshape(heads, -1).t(), rtol=0, atol=1e-6)


def test_the_converter_takes_the_family_class_and_drops_only_its_buffers():
    cswin = MODELS.get('InLineCSWinTransformer')
    t = torch.zeros(1)
    sd = collections.OrderedDict([('head.weight', t), ('stage1.0.qkv.weight', t),
                                  ('layers.0.blocks.0.attn.relative_position_index', t)])
    # CSWin's own hook renames; Swin's buffer regex is not applied to a CSWin file
    assert list(convert_state_dict(sd, cswin)) == [
        'stages.0.blocks.0.attn.qkv.weight', 'layers.0.blocks.0.attn.relative_position_index']
    assert list(convert_state_dict(sd, 'InLineSwinTransformer')) == ['stage1.0.qkv.weight']
    assert dropped_entries(cswin).pattern == CLASSIFIER

    class Unregistered(cswin):  # a subclass keeps its family's hook, found by class
        pass
    assert list(convert_state_dict(sd, Unregistered))[0] == 'stages.0.blocks.0.attn.qkv.weight'
