"""The installed stack: imports, compiled mmcv ops on CPU, the environment check."""
import subprocess
import sys

import torch


def test_stack_imports_with_compatible_versions():
    import mmcv
    import mmdet
    import mmengine
    import mmseg
    import timm  # noqa: F401
    from mmengine.utils import digit_version
    assert digit_version('2.0.0') <= digit_version(mmcv.__version__) < digit_version('2.2.0')
    assert mmdet.__version__.startswith('3.') and mmseg.__version__.startswith('1.')
    assert digit_version(mmengine.__version__) >= digit_version('0.10.0')


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
    assert 'OK' in res.stdout and 'mmcv 2.1.0' in res.stdout


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


def test_environment_check_explains_incompatible_mmcv(monkeypatch):
    import mmcv

    from mmplugin_inline.utils import env_check
    monkeypatch.setattr(mmcv, '__version__', '2.2.0')
    text, ok = env_check.environment_report()
    assert not ok and 'mmcv 2.2.0 is installed' in text and '< 2.2.0' in text
