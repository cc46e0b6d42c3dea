"""The installed stack: imports, compiled mmcv ops on CPU, the environment check."""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from helpers.tiny_models import REPO


def _line():
    from mmplugin_inline.utils import stacks
    line, problems = stacks.detect_line()
    assert line is not None and not problems, problems
    return line


def _pinned(dist):
    """The version of ``dist`` pinned for the running line's tested environment."""
    from mmplugin_inline.utils import stacks
    name = 'pinned.txt' if _line() == stacks.OFFICIAL else 'pinned-onedl.txt'
    with open(osp.join(REPO, 'requirements', name), encoding='utf-8') as f:
        for text in f:
            if text.startswith(dist + '=='):
                return text.split('==')[1].split('#')[0].strip()
    raise AssertionError(f'{dist} is not pinned in {name}')


def test_stack_imports_the_pinned_versions_of_its_line():
    """The tested environments hold exactly their line's pins (make setup / STACK=onedl)."""
    import mmcv
    import mmdet
    import mmengine
    import mmseg
    import timm  # noqa: F401

    from mmplugin_inline.utils import stacks
    line = _line()
    for module in (mmengine, mmcv, mmdet, mmseg):
        dist = stacks.COMPONENT[module.__name__].dists[line]
        assert module.__version__ == _pinned(dist), (dist, module.__version__)
    assert torch.__version__.split('+')[0] == _pinned('torch')


def test_mmcv_compiled_ops_run_on_cpu():
    from mmcv.ops import RoIAlign, nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    dets, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2]
    feat = torch.arange(64.).view(1, 1, 8, 8)
    rois = torch.tensor([[0., 0., 0., 3., 3.]])
    out = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)(feat, rois)
    assert out.shape == (1, 1, 2, 2)
    # f(y, x) = 8y + x is linear, so bilinear sampling is exact. aligned=True shifts the
    # RoI to [-0.5, 2.5]; bin 0 spans [-0.5, 1.0], sampled at -0.125 (clamped to 0 by
    # mmcv) and 0.625: mean coordinate 0.3125 in y and x -> 8 * 0.3125 + 0.3125.
    assert torch.allclose(out[0, 0, 0, 0], torch.tensor(9 * 0.3125))


def test_environment_check_command_reports_ok():
    res = subprocess.run([sys.executable, '-m', 'mmplugin_inline.utils.env_check'],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    from mmplugin_inline.utils import stacks
    line = _line()
    mmcv = _pinned(stacks.COMPONENT['mmcv'].dists[line])
    assert 'OK' in res.stdout and f'mmcv {mmcv}' in res.stdout
    assert f'OpenMMLab line: {stacks.LINE_NAMES[line]}' in res.stdout


def test_environment_check_explains_missing_ops(monkeypatch):
    from mmplugin_inline.utils import env_check
    real = env_check._try_import

    def fake(name):
        if name == 'mmcv._ext':
            return None, ModuleNotFoundError("No module named 'mmcv._ext'")
        return real(name)

    monkeypatch.setattr(env_check, '_try_import', fake)
    text, ok = env_check.environment_report()
    assert not ok
    assert "No module named 'mmcv._ext'" in text and 'make setup' in text


@pytest.mark.parametrize('line, version, needs', [
    ('official', '2.2.0', '2.0.0rc4 <= mmcv < 2.2.0'),   # the fork's mmcv under official mmdet
    ('onedl', '2.1.0', '2.2.0 <= mmcv < 3.0.0'),         # the official mmcv under the fork
])
def test_environment_check_holds_mmcv_to_its_lines_range(monkeypatch, line, version, needs):
    import mmcv

    from mmplugin_inline.utils import env_check, stacks
    monkeypatch.setattr(stacks, 'detect_line', lambda: (line, []))
    monkeypatch.setattr(mmcv, '__version__', version)
    text, ok = env_check.environment_report()
    assert not ok and f'mmcv {version} is installed' in text and needs in text, text
    assert stacks.LINE_NAMES[line] in text


@pytest.mark.parametrize('version, refused', [('2.7.1+cu126', True), ('2.6.0', True),
                                               ('2.5.1', True), ('2.8.0', False),
                                               ('2.8.0rc1', False), ('2.14.1', False),
                                               ('2.17.0', False)])
def test_environment_check_refuses_a_torch_below_the_floor_by_name(monkeypatch, version,
                                                                    refused):
    from mmplugin_inline.utils import env_check, stacks
    monkeypatch.setattr(torch, '__version__', version)
    text, ok = env_check.environment_report()
    assert (f'torch {version} is older than the lowest torch' in text) is refused, text
    assert ok is (not refused), text  # the tested environment is otherwise sound
    if refused:
        assert f'torch >= {stacks.TORCH_FLOOR}' in text
    if version == '2.17.0':  # newer than tested: said, not refused
        assert 'untested' in text and ok, text


def test_release_numbers_need_no_parser():
    from mmplugin_inline.utils.stacks import release
    assert release('2.6.0+cu124') == (2, 6, 0) and release('2.10.0a0+git1') == (2, 10, 0)
    assert release('2.6') < release('2.10.0') and release('2.6.0rc1') >= release('2.6')


def _fake_dists(monkeypatch, dists):
    from mmplugin_inline.utils import stacks
    monkeypatch.setattr(stacks, 'installed_version', lambda dist: dists.get(dist))


def test_each_line_is_named_and_accepted(monkeypatch):
    from mmplugin_inline.utils import stacks
    _fake_dists(monkeypatch, {'mmengine': '0.10.7', 'mmcv': '2.1.0', 'mmdet': '3.3.0',
                              'mmsegmentation': '1.2.2'})
    assert stacks.detect_line() == (stacks.OFFICIAL, [])
    _fake_dists(monkeypatch, {'onedl-mmengine': '0.10.12', 'onedl-mmcv': '2.3.6',
                              'onedl-mmdetection': '3.5.1', 'onedl-mmsegmentation': '1.4.2'})
    assert stacks.detect_line() == (stacks.ONEDL, [])
    _fake_dists(monkeypatch, {'mmengine': '0.10.7', 'mmcv-lite': '2.1.0'})
    assert stacks.detect_line() == (stacks.OFFICIAL, [])


def test_a_mix_of_the_lines_is_refused_with_the_fix(monkeypatch):
    """Official mmdet over the fork's mmcv: refused, naming what to uninstall and install."""
    from mmplugin_inline.utils import env_check, stacks
    _fake_dists(monkeypatch, {'onedl-mmengine': '0.10.12', 'onedl-mmcv': '2.3.6',
                              'mmdet': '3.3.0', 'onedl-mmsegmentation': '1.4.2'})
    line, problems = stacks.detect_line()
    assert line is None and len(problems) == 1
    assert 'mixes two OpenMMLab lines' in problems[0]
    assert 'pip uninstall -y mmdet' in problems[0] and 'onedl-mmdetection' in problems[0]
    text, ok = env_check.environment_report()
    assert not ok and 'mixes two OpenMMLab lines' in text


def test_two_distributions_of_one_package_are_refused(monkeypatch):
    from mmplugin_inline.utils import stacks
    _fake_dists(monkeypatch, {'mmengine': '0.10.7', 'onedl-mmengine': '0.10.12'})
    line, problems = stacks.detect_line()
    assert line is None
    assert 'mmengine 0.10.7 and onedl-mmengine 0.10.12 are both installed' in problems[0]
    assert 'pip uninstall -y mmengine onedl-mmengine' in problems[0]


def test_tools_stop_at_start_on_a_mix_and_say_why(tmp_path):
    """A tool run over a mixed stack exits 1 with the environment report (the mix is
    simulated in a child interpreter by the metadata of the *other* line's mmdet on its
    path: official mmdet over the fork, or the fork's over the official line)."""
    from mmplugin_inline.utils import stacks
    other = stacks.ONEDL if _line() == stacks.OFFICIAL else stacks.OFFICIAL
    dist_name = stacks.COMPONENT['mmdet'].dists[other]
    version = '3.5.1' if other == stacks.ONEDL else '3.3.0'
    dist = tmp_path / f"{dist_name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir()
    (dist / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: {dist_name}\n'
                                   f'Version: {version}\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    res = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'misc', 'print_config.py'),
                          osp.join(REPO, 'configs', 'demo',
                                   'mask-rcnn_inline-pvt-t_fpn_shapes-demo.py')],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f'{dist_name} {version}' in res.stderr and 'are both installed' in res.stderr, \
        res.stderr[-2000:]
    assert 'pip uninstall -y mmdet onedl-mmdetection' in res.stderr
