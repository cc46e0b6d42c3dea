"""The bad-input catalogue (README, "Bad input: what works and what errors"): one case
per row. Inputs that must work are compared with a reference; inputs that must fail are
checked for an error that names the problem and what to change."""
import json
import os
import os.path as osp
import shutil

import pytest
import torch

from helpers.fidelity import load_fixture
from helpers.runs import DET_CONFIG, tool_failure
from helpers.tiny_models import TINY_BACKBONES, det_run_config
from mmplugin_inline.engine.preflight import json_top_level_value
from mmplugin_inline.registry import MODELS, registered_families

FAMILIES = sorted(registered_families())
SHORT = {'InLinePVT': 'pvt', 'InLineSwinTransformer': 'swin', 'InLineCSWinTransformer': 'cswin',
         'InLineDeiT': 'deit'}
STRIDES = {'InLineDeiT': [16] * 4}  # the tiny DeiT returns 4 maps at stride 16


def build(name, **kw):
    arch, extra, _ = TINY_BACKBONES[name]
    cfg = dict(type=name, arch=dict(arch), drop_path_rate=0.0, **extra)
    cfg.update(kw)
    return MODELS.build(cfg)


@pytest.fixture(scope='module')
def tiny():
    """One seeded tiny model per family, in eval mode, shared by the forward rows."""
    torch.manual_seed(0)
    return {name: build(name).eval() for name in FAMILIES}


def assert_same(outs, refs, atol=1e-5):
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs):
        assert out.shape == ref.shape
        assert torch.allclose(out, ref, atol=atol, rtol=1e-4), (out - ref).abs().max()


# ------------------------------------------------------------------ inputs that must work

@pytest.mark.parametrize('hw', [(1, 1), (7, 9), (31, 17), (32, 2048), (2048, 32)],
                         ids=lambda hw: f'{hw[0]}x{hw[1]}')
@pytest.mark.parametrize('name', FAMILIES)
def test_any_image_size_works_and_equals_the_zero_padded_image(tiny, name, hw):
    # images smaller than the total stride and extreme aspect ratios: maps of
    # ceil(size / stride), and the same values as the image zero-padded to a multiple of
    # the first stride by hand (the backbone pads inside; no pixel dropped, none invented)
    model = tiny[name]
    x = torch.randn(1, 3, *hw)
    first = STRIDES.get(name, [4])[0]
    padded = torch.nn.functional.pad(x, (0, -hw[1] % first, 0, -hw[0] % first))
    with torch.no_grad():
        outs = model(x)
        refs = model(padded) if padded.shape != x.shape else outs
    for out, stride in zip(outs, STRIDES.get(name, [4, 8, 16, 32])):
        assert out.shape[2:] == tuple(-(-s // stride) for s in hw)
        assert torch.isfinite(out).all() and out.is_contiguous()
    assert_same(outs, refs, atol=1e-6)


@pytest.mark.parametrize('name', FAMILIES)
def test_batch_of_3_equals_three_batches_of_1(tiny, name):
    x = torch.randn(3, 3, 23, 19)
    with torch.no_grad():
        batched = tiny[name](x)
        singles = [tiny[name](x[i:i + 1]) for i in range(3)]
    for level, out in enumerate(batched):
        assert_same([out], [torch.cat([s[level] for s in singles])])


LAYOUTS = {
    'channels_last': lambda x: x.to(memory_format=torch.channels_last),
    'non_contiguous': lambda x: torch.stack([x, x], -1)[..., 0],  # a view with strides 2
}


@pytest.mark.parametrize('layout', sorted(LAYOUTS))
@pytest.mark.parametrize('name', FAMILIES)
def test_memory_layout_of_the_input_does_not_change_the_output(tiny, name, layout):
    x = torch.randn(1, 3, 33, 26)
    y = LAYOUTS[layout](x)
    assert torch.equal(y, x) and not y.is_contiguous()
    with torch.no_grad():
        assert_same(tiny[name](y), tiny[name](x))


# ------------------------------------------------------------------ inputs that must fail

FORWARD_ERRORS = {
    # row: (input, error type, words the message must hold: the problem, what to change)
    'wrong_channel_count': (lambda: torch.randn(1, 4, 32, 32), ValueError,
                            ['in_channels=3', 'has 4 channels', 'set in_channels=4']),
    'uint8_image': (lambda: torch.randint(0, 255, (1, 3, 32, 32), dtype=torch.uint8), TypeError,
                    ['torch.uint8', 'x.float()', 'data preprocessor']),
    'int64_image': (lambda: torch.randint(0, 255, (1, 3, 32, 32)), TypeError,
                    ['torch.int64', 'x.float()', 'data preprocessor']),
    'empty_batch': (lambda: torch.randn(0, 3, 32, 32), ValueError,
                    ['empty input', 'no images', 'skip empty batches']),
    'no_batch_dimension': (lambda: torch.randn(3, 32, 32), ValueError,
                           ['4-D batch', 'x[None]']),
    'image_without_pixels': (lambda: torch.randn(1, 3, 0, 32), ValueError,
                             ['empty input', 'no pixels', 'resizing / cropping']),
    'list_of_images': (lambda: [torch.randn(3, 32, 32)], TypeError,
                       ['got list', 'stack the images']),
}


@pytest.mark.parametrize('row', sorted(FORWARD_ERRORS))
@pytest.mark.parametrize('name', FAMILIES)
def test_bad_input_tensors_are_named(tiny, name, row):
    make, error, words = FORWARD_ERRORS[row]
    with pytest.raises(error) as exc:
        tiny[name](make())
    assert str(exc.value).startswith(name)
    for word in words:
        assert word in str(exc.value)


def _poison_first_block_of_stage_2(model, name):
    with torch.no_grad():  # DeiT's stages are its blocks
        model.stages[1].blocks[0].mlp.fc2.bias[0] = float('nan')


def _poison_stem(model, name):
    with torch.no_grad():
        next(model.stage_modules()[0][0].parameters()).view(-1)[0] = float('inf')


@pytest.mark.parametrize('name', FAMILIES)
def test_non_finite_values_pass_silently_unless_check_finite(name):
    model = build(name).eval()
    x = torch.randn(1, 3, 32, 32)
    x[0, 0, 0, 0] = float('nan')
    with torch.no_grad():
        assert not torch.isfinite(model(x)[-1]).all()  # off by default: no check, no cost


@pytest.mark.parametrize('where', ['input', 'stem', 'stage_2'])
@pytest.mark.parametrize('name', FAMILIES)
def test_check_finite_names_where_nan_or_inf_first_appear(name, where):
    model = build(name, check_finite=True).eval()
    x = torch.randn(1, 3, 32, 32)
    if where == 'input':
        with torch.no_grad():
            assert all(torch.isfinite(o).all() for o in model(x))  # finite: no error
        x[0, 1, 2, 3] = float('inf')
        expect = ['the input holds non-finite values', '1 Inf', 'data pipeline']
    elif where == 'stem':
        _poison_stem(model, name)
        expect = ['first appear in the stem (patch embedding)', 'the input was finite']
    else:
        _poison_first_block_of_stage_2(model, name)
        unit = 'block' if name == 'InLineDeiT' else 'stage'
        expect = [f'first appear in {unit} 2 ', 'earlier layers were finite', 'learning rate']
    with pytest.raises(FloatingPointError) as exc, torch.no_grad():
        model(x)
    assert str(exc.value).startswith(f'{name} (check_finite=True)')
    for word in expect:
        assert word in str(exc.value)


def _heads_not_dividing(name):
    arch = dict(TINY_BACKBONES[name][0])
    heads = arch['num_heads']
    arch['num_heads'] = [3] + heads[1:] if isinstance(heads, list) else 3
    return dict(arch=arch)


CONFIG_ERRORS = {
    # row: (backbone options, words of the message); 'block_types' does not apply to DeiT
    'unknown_arch': (lambda n: dict(arch='xl'), ['unknown arch', 'choose one of']),
    'unknown_block_type_letter': (lambda n: dict(block_types='IIXI'),
                                  ["use ['X']", "'I' (InLine), 'S' (softmax)"]),
    'unknown_kernel': (lambda n: dict(kernel='gelu'),
                       ["unknown attention kernel 'gelu'", 'set kernel=', "'identity'"]),
    'heads_not_dividing_width': (_heads_not_dividing, ['num_heads=3 must divide the width',
                                                       'set num_heads', 'one of [']),
    'out_indices_out_of_range': (lambda n: dict(out_indices=(0, 13)),
                                 ['out_indices (0, 13) out of range', 'use indices 0 to']),
    'frozen_stages_too_large': (lambda n: dict(frozen_stages=13),
                                ['frozen_stages=13 is out of range', 'use -1 to']),
    'frozen_stages_below_minus_1': (lambda n: dict(frozen_stages=-2),
                                    ['frozen_stages=-2 is out of range', 'use -1 to']),
}


OPTION_CASES = [(name, row) for name in FAMILIES for row in sorted(CONFIG_ERRORS)
                if not (name == 'InLineDeiT' and row == 'unknown_block_type_letter')]


@pytest.mark.parametrize('name,row', OPTION_CASES, ids=[f'{n}-{r}' for n, r in OPTION_CASES])
def test_bad_backbone_options_are_named(name, row):
    options, words = CONFIG_ERRORS[row]
    with pytest.raises(ValueError) as exc:
        build(name, **options(name)).train()  # frozen_stages is applied by train()
    for word in words:
        assert word in str(exc.value)


# ------------------------------------------------------------------ checkpoints

def _save(tmp_path, state_dict):
    path = tmp_path / 'weights.pth'
    torch.save({'model': state_dict}, path)
    return str(path)


def _pretrained(name, path, **kw):
    return build(name, init_cfg=dict(type='Pretrained', checkpoint=path), **kw)


@pytest.mark.parametrize('name', FAMILIES)
def test_a_checkpoint_of_another_family_names_it_and_what_to_build(name, tmp_path):
    other = FAMILIES[(FAMILIES.index(name) + 1) % len(FAMILIES)]
    path = _save(tmp_path, load_fixture(SHORT[other])['checkpoint']['model'])
    with pytest.raises(RuntimeError) as exc:
        _pretrained(name, path).init_weights()
    message = str(exc.value)
    assert message.startswith(f'{name}: {path} does not fit this model')
    assert f'looks like an {other} checkpoint' in message
    assert f"build {other} (type='{other}')" in message
    assert registered_families()[name].short_name in message  # its own released files


def _deeper(name):
    arch = dict(TINY_BACKBONES[name][0])
    if 'depths' in arch:
        arch['depths'] = [arch['depths'][0] + 1] + arch['depths'][1:]
    else:
        arch['depth'] += 1
    return arch


@pytest.mark.parametrize('direction', ['deeper_file', 'shallower_file'])
@pytest.mark.parametrize('name', FAMILIES)
def test_a_checkpoint_of_another_depth_is_an_error_not_a_partial_load(name, direction, tmp_path):
    # e.g. InLine-PVT-S weights into arch='t': same widths, more blocks. Most parameters
    # match, so this used to load with a warning only
    deep, shallow = build(name, arch=_deeper(name)), build(name)
    source, target = (deep, shallow) if direction == 'deeper_file' else (shallow, deep)
    path = _save(tmp_path, source.state_dict())
    target.init_cfg = dict(type='Pretrained', checkpoint=path)
    with pytest.raises(RuntimeError) as exc:
        target.init_weights()
    message = str(exc.value)
    assert 'for another arch / size' in message and 'set arch to the preset' in message
    first = 'stages' if name == 'InLineDeiT' else 'stages.0.blocks'  # DeiT: one block a stage
    n = len(list(_list(target, first)))
    expect = (f'{first}: {n + 1} in the checkpoint, {n} in the model' if direction ==
              'deeper_file' else f'{first}: {n - 1} in the checkpoint, {n} in the model')
    assert expect in message


def _list(model, dotted):
    for part in dotted.split('.'):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


# ------------------------------------------------------------------ data, through tools/train.py

def _train_failure(config, capsys, monkeypatch, cwd):
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.chdir(cwd)
    from mmplugin_inline.cli import train
    return tool_failure(train.main, [str(config)], capsys)


def test_a_coco_json_naming_a_missing_image_is_reported_by_train(shapes, tmp_path, capsys,
                                                                 monkeypatch):
    root = tmp_path / 'shapes'
    shutil.copytree(shapes, root)
    with open(root / 'annotations/instances_training.json') as f:
        gone = json.load(f)['images'][1]['file_name']
    os.remove(root / 'images/training' / gone)
    config = tmp_path / 'run.py'
    config.write_text(det_run_config(DET_CONFIG, str(root)))
    err = _train_failure(config, capsys, monkeypatch, tmp_path)
    assert 'instances_training.json lists 1 of its 4 images that are not in' in err
    assert f': {gone}.' in err and 'point data_prefix.img' in err
    assert 'validation' not in err  # the validation images are all there


def test_a_data_root_that_does_not_exist_is_reported_by_train(tmp_path, capsys, monkeypatch):
    root = tmp_path / 'no_such_data'
    config = tmp_path / 'run.py'
    config.write_text(det_run_config(DET_CONFIG, str(root)))
    err = _train_failure(config, capsys, monkeypatch, tmp_path)
    assert f'data_root {root}' in err and 'not found' in err
    assert 'How to get it' in err and f'ln -s /path/to/it {root}' in err


def test_the_images_list_is_read_wherever_it_is_in_the_json(tmp_path):
    images = [{'file_name': f'{i}.jpg', 'id': i} for i in range(50)]
    bulky = [{'bbox': [1.0, 2.0, 3.0, 4.0], 'id': i} for i in range(200)]
    for i, data in enumerate([dict(info={}, images=images, annotations=bulky),
                              dict(annotations=bulky, n=123456789, images=images)]):
        path = osp.join(tmp_path, f'{i}.json')
        with open(path, 'w') as f:
            json.dump(data, f, indent=i)
        for chunk in (5, 1 << 20):  # values split across reads, and one read
            assert json_top_level_value(path, 'images', chunk=chunk) == images
        assert json_top_level_value(path, 'categories', chunk=5) is None
    with open(osp.join(tmp_path, 'cut.json'), 'w') as f:
        f.write(json.dumps(dict(images=images))[:-20])  # truncated: left to the dataset
    assert json_top_level_value(osp.join(tmp_path, 'cut.json'), 'images', chunk=5) is None
