"""The timm face: the families as timm models, in a Python without OpenMMLab.

The fidelity checks compare with the authors' own outputs (their ``forward_features``
through the checkpoint's head); the libraries (timm, smp, transformers) are the real ones.
"""
import pytest
import timm
import torch

import mmplugin_inline  # noqa: F401  (registers the timm models)
from helpers.authors_files import FAMILIES, load_fixture, reference_logits, training_format_file
from helpers.no_openmmlab import run_without_openmmlab
from mmplugin_inline.timm_models import CLASSIFIERS, timm_names

NAMES = ['inline_pvt_tiny', 'inline_pvt_small', 'inline_pvt_medium', 'inline_pvt_large',
         'inline_swin_tiny', 'inline_swin_small', 'inline_swin_base',
         'inline_cswin_tiny', 'inline_cswin_small', 'inline_cswin_base',
         'inline_deit_tiny', 'inline_deit_small', 'inline_deit_base']


def _reference_model(family, path=None, **kwargs):
    """The tiny timm model of ``family`` shaped as the reference fixture's (its arch, its
    10 classes), loaded from ``path`` through timm's pretrained loading when given."""
    fixture = load_fixture(family)
    args = CLASSIFIERS[f'inline_{family}'].family.config_from_authors_args(fixture['arch'])
    args.update(drop_path_rate=0.0, num_classes=10, **kwargs)
    if path is not None:
        args.update(pretrained=True, pretrained_cfg_overlay=dict(file=path))
    return timm.create_model(f'inline_{family}_tiny', **args).eval(), fixture


def test_names_and_pretrained_cfgs():
    assert sorted(timm_names()) == sorted(NAMES)
    assert sorted(timm.list_models('inline_*')) == sorted(NAMES)
    for name in NAMES:
        cfg = timm.models.get_pretrained_cfg(name)
        family, size = name.rsplit('_', 1)
        url, file_name = cfg.url
        released = CLASSIFIERS[family].released_weights[size[0]][1]
        assert url == released and file_name == f'{family}_{size[0]}.pth'
        assert cfg.custom_load and cfg.num_classes == 1000 and cfg.classifier == 'head'
    assert timm.models.get_pretrained_cfg('inline_deit_small').input_size == (3, 288, 288)


@pytest.mark.parametrize('family', FAMILIES)
def test_authors_file_gives_authors_logits(family, tmp_path):
    """``pretrained=True`` with a file in the authors' training format (yacs config inside,
    no yacs installed) loads through timm and gives the authors' logits."""
    path = training_format_file(family, str(tmp_path))
    model, fixture = _reference_model(family, path)
    for case in fixture['cases']:
        with torch.no_grad():
            logits = model(case['input'])
        ref = reference_logits(fixture, case)
        assert (logits - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_without_openmmlab(tmp_path):
    """Where mmcv, mmengine, mmdet and mmseg cannot be imported: the package imports, each
    family's tiny model loads an authors'-format file with pretrained=True and gives their
    logits, features_only works at a size that is no multiple of 32, and no OpenMMLab
    module is imported."""
    out = run_without_openmmlab(f'''
        import timm, torch
        import mmplugin_inline
        from helpers.authors_files import load_fixture, reference_logits, training_format_file
        from mmplugin_inline.timm_models import CLASSIFIERS
        for family in {FAMILIES!r}:
            fixture = load_fixture(family)
            args = CLASSIFIERS[f'inline_{{family}}'].family.config_from_authors_args(
                fixture['arch'])
            path = training_format_file(family, {str(tmp_path)!r})
            model = timm.create_model(f'inline_{{family}}_tiny', pretrained=True,
                                      pretrained_cfg_overlay=dict(file=path), num_classes=10,
                                      drop_path_rate=0.0, **args).eval()
            for case in fixture['cases']:
                with torch.no_grad():
                    ref = reference_logits(fixture, case)
                    err = (model(case['input']) - ref).abs().max() / ref.abs().max()
                assert err <= 1e-4, (family, float(err))
            feats = timm.create_model(f'inline_{{family}}_tiny', features_only=True)
            with torch.no_grad():
                maps = feats(torch.randn(1, 3, 200, 250))
            print(family, [tuple(m.shape) for m in maps], feats.feature_info.reduction())
    ''')
    assert 'pvt [(1, 64, 50, 63), (1, 128, 25, 32), (1, 320, 13, 16), (1, 512, 7, 8)]' in out
    assert 'swin [(1, 96, 50, 63), (1, 192, 25, 32), (1, 384, 13, 16), (1, 768, 7, 8)]' in out
    assert 'cswin [(1, 64, 50, 63), (1, 128, 25, 32), (1, 256, 13, 16), (1, 512, 7, 8)]' in out
    assert 'deit [(1, 192, 13, 16), (1, 192, 13, 16), (1, 192, 13, 16), (1, 192, 13, 16)] ' \
        '[16, 16, 16, 16]' in out


@pytest.mark.parametrize('family', FAMILIES)
def test_features_match_the_authors_stages(family, tmp_path):
    """features_only maps are the authors' stage outputs (DeiT: the blocks they recorded)."""
    fixture = load_fixture(family)
    extra = dict(out_indices=fixture['arch']['out_blocks']) if family == 'deit' else {}
    model, _ = _reference_model(family, training_format_file(family, str(tmp_path)),
                                features_only=True, **extra)
    case = fixture['cases'][0]
    with torch.no_grad():
        maps = model(case['input'])
    assert len(maps) == len(case['stage_outputs'])
    for ours, theirs in zip(maps, case['stage_outputs']):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('name', NAMES)
def test_meta_device_construction(name):
    """smp builds its encoders on the meta device first: every preset builds there."""
    with torch.device('meta'):
        model = timm.create_model(name, features_only=True)
    assert all(p.is_meta for p in model.parameters())
    assert model.feature_info.reduction()[-1] in (16, 32)


def test_intermediates_and_timm_options():
    model = timm.create_model('inline_swin_tiny', arch=dict(embed_dim=32, depths=[1, 1, 1, 1],
                                                            num_heads=[1, 2, 4, 8])).eval()
    x = torch.randn(2, 3, 70, 90)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=2)
        last = model.forward_intermediates(x, indices=[-1], intermediates_only=True)
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    assert [m.shape[1] for m in maps] == [128, 256] and final.shape == (2, 9, 256)
    torch.testing.assert_close(last[0], maps[1])
    assert pooled.shape == (2, 256)
    model.reset_classifier(7)
    assert model(x).shape == (2, 7)
    with pytest.raises(ValueError, match='output_stride=16 is not supported'):
        timm.create_model('inline_pvt_tiny', output_stride=16)
    assert timm.create_model('inline_pvt_tiny', output_stride=32, num_classes=0)(
        torch.randn(1, 3, 64, 64)).shape == (1, 512)


def test_plugin_options_and_in_chans(tmp_path):
    """The family's own options reach the model; in_chans adapts a pretrained stem."""
    model = timm.create_model('inline_pvt_tiny', block_types='ISLI', local_residual=False,
                              pad_aware=True, in_chans=1)
    letters = [type(m.attn.mixer).letter for s in model.stages for m in s.blocks]
    assert letters[:2] == ['I', 'I'] and letters[2:4] == ['S', 'S'] and letters[4:6] == ['L', 'L']
    assert all(getattr(b.attn.mixer, 'residual', None) is None for s in model.stages
               for b in s.blocks)
    gray, _ = _reference_model('pvt', training_format_file('pvt', str(tmp_path)), in_chans=1)
    rgb, fixture = _reference_model('pvt', training_format_file('pvt', str(tmp_path)))
    stem = 'stages.0.downsample.proj.weight'
    torch.testing.assert_close(gray.state_dict()[stem],
                               rgb.state_dict()[stem].sum(dim=1, keepdim=True))


def test_wrong_file_is_refused(tmp_path):
    """A file of another size does not load quietly: the message names what did not fit."""
    with pytest.raises(RuntimeError, match='does not fit this model'):
        timm.create_model('inline_swin_tiny', pretrained=True, pretrained_cfg_overlay=dict(
            file=training_format_file('swin', str(tmp_path))))


def test_same_modules_as_the_openmmlab_face():
    """One definition, two faces: the timm model's stage maps are the OpenMMLab backbone's
    with the same weights (no output norms)."""
    pytest.importorskip('mmengine')
    from mmplugin_inline.openmmlab.backbones import InLineSwinTransformer
    arch = dict(embed_dim=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8])
    timm_model = timm.create_model('inline_swin_tiny', arch=arch, features_only=True).eval()
    mm = InLineSwinTransformer(arch=arch, out_norm=False).eval()
    missing, unexpected = mm.load_state_dict(timm_model.model.state_dict(), strict=False)
    assert not missing and set(unexpected) <= {'norm.weight', 'norm.bias'}
    x = torch.randn(1, 3, 75, 101)
    with torch.no_grad():
        for a, b in zip(timm_model(x), mm(x)):
            torch.testing.assert_close(a, b)


def test_the_timm_extra_pulls_no_openmmlab_package():
    """``pip install .[timm]`` installs torch and timm, nothing of either OpenMMLab line."""
    import configparser
    import os
    import re

    from helpers.paths import REPO
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, 'setup.cfg'))

    def names(text):
        lines = [line.strip() for line in text.splitlines()]
        return {re.split(r'[<>=!~\[ ;]', line, maxsplit=1)[0].lower()
                for line in lines if line and not line.startswith('#')}

    pulled = names(cfg['options']['install_requires']) | names(
        cfg['options.extras_require']['timm'])
    assert pulled == {'torch', 'timm'}


def test_pretrained_downloads_the_released_address(tmp_path, monkeypatch):
    """``pretrained=True`` without a file: timm downloads the released address (a cloud
    share's ``/f/<id>/?dl=1``, no file name in it) under the name in the model's
    ``pretrained_cfg``, once, and the plugin's loader reads it. Served on 127.0.0.1."""
    import os
    import shutil

    from helpers.local_server import serve_folder
    share = tmp_path / 'share' / 'f' / 'abc123'
    share.mkdir(parents=True)
    shutil.copy(training_format_file('swin', str(tmp_path)), share / 'max_acc.pth')
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    fixture = load_fixture('swin')
    args = CLASSIFIERS['inline_swin'].family.config_from_authors_args(fixture['arch'])
    with serve_folder(str(tmp_path / 'share')) as (base, requests):
        overlay = dict(url=(f'{base}/f/abc123/?dl=1', 'inline_swin_t.pth'))
        for _ in range(2):
            model = timm.create_model('inline_swin_tiny', pretrained=True, num_classes=10,
                                      pretrained_cfg_overlay=overlay, drop_path_rate=0.0,
                                      **args).eval()
    assert requests == ['/f/abc123/?dl=1']  # the second build read the cached file
    cached = [f for _, _, files in os.walk(tmp_path / 'torch_home') for f in files]
    assert cached == ['inline_swin_t.pth']
    case = fixture['cases'][0]
    with torch.no_grad():
        ref = reference_logits(fixture, case)
        assert (model(case['input']) - ref).abs().max() <= 1e-4 * ref.abs().max()
