"""ONNX export (mmplugin_inline.deployment.onnx; tools/deployment/pytorch2onnx.py runs it):
onnxruntime against PyTorch eager.

Each export keeps batch, height and width dynamic; the ONNX file is then run at sizes
other than the export size (not multiples of 32, odd) with batch 1 and 2, and compared
with the same module in PyTorch. Without the symbolic padding arithmetic of
``core/tokens.py`` the export fixed H and W (or padded by a traced constant) and these
comparisons fail: wrong map sizes at sizes that need another padding.
"""
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

from helpers.runs import PYTHON, ok, run_tool, tool_failure
from helpers.tiny_models import REPO, TINY_BACKBONES
from helpers.tool_configs import tiny_sem_fpn
from mmplugin_inline.cli import pytorch2onnx
from mmplugin_inline.deployment import onnx as export
from mmplugin_inline.deployment import verify
from mmplugin_inline.models.layers import PatchEmbed
from mmplugin_inline.registry import MODELS

pytest.importorskip('onnxruntime')

EXPORT_HW = (64, 96)
# sizes other than the export size; none a multiple of 32, most odd (the tiny-model scale
# of 250x333: 63x84 tokens at stride 4)
VERIFY_HW = [(61, 83), (77, 101)]


def _check(rows, tol=1e-4):
    message = verify.check_rows(rows, tol)
    assert message is None, message
    assert {r['batch'] for r in rows} == {1, 2}
    assert {r['hw'] for r in rows} == set(VERIFY_HW)


def test_dynamic_groups_conv_is_the_depthwise_conv():
    """The exported form of the per-sample depthwise conv equals F.conv2d."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 6, 9, 11, generator=gen)
    w = torch.randn(6, 1, 3, 3, generator=gen)
    bias = torch.randn(6, generator=gen)
    # a SymInt-like groups: any non-int takes the decomposition
    groups = torch.tensor(6)
    got = export.conv2d_dynamic_groups(x, w, bias, padding=(1, 1), groups=groups)
    torch.testing.assert_close(got, F.conv2d(x, w, bias, padding=1, groups=6))
    assert export.conv2d_dynamic_groups(x, w, groups=6) is NotImplemented
    with pytest.raises(NotImplementedError, match='depthwise'):
        export.conv2d_dynamic_groups(x, torch.randn(3, 2, 3, 3), groups=groups)


def test_patch_embed_pads_by_the_input_size(tmp_path):
    """The bug: at 250x333 an export made at 256x320 returned 62x83 maps instead of 63x84."""
    torch.manual_seed(0)
    embed = PatchEmbed(3, 8, 4).eval()

    class Maps(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = embed

        def forward(self, x):
            tokens, (h, w) = self.embed(x)
            return tokens.transpose(1, 2).reshape(x.shape[0], 8, h, w)

    module = Maps().eval()
    path = str(tmp_path / 'embed.onnx')
    export.export_onnx(module, (64, 80), path)
    rows = verify.verify_onnx(module, path, [(63, 85), (250, 333)])
    assert {r['shape'][2:] for r in rows} == {(16, 22), (63, 84)}
    assert verify.check_rows(rows, 1e-5) is None, verify.check_rows(rows, 1e-5)


def test_mmseg_upsampling_keeps_the_input_size_in_the_exported_graph():
    """mmseg's Upsample takes int(size * factor): exported as is, that is the example's."""
    from mmseg.models.utils import Upsample, resize

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = Upsample(scale_factor=2, mode='bilinear', align_corners=False)

        def forward(self, x):
            return resize(self.up(x), size=(2 * x.shape[2] + 1, 2 * x.shape[3] + 1),
                          mode='bilinear', align_corners=False)

    head = Head()
    auto = torch.export.Dim.AUTO
    example, other = torch.randn(2, 4, 6, 8), torch.randn(1, 4, 5, 11)
    dims = ({0: auto, 2: auto, 3: auto},)
    plain = torch.export.export(head, (example,), dynamic_shapes=dims)
    # fixed to 2 * 6 = 12 rows: torch 2.9 on refuses another size (a guard), 2.8 runs it
    # with the example's size inside and so gives other values than eager
    try:
        wrong = plain.module()(other)
    except AssertionError as exc:
        assert 'Guard failed' in str(exc)
    else:
        assert not torch.allclose(wrong, head(other), atol=1e-3)
    with export.exportable_upsampling(head):
        exported = torch.export.export(head, (example,), dynamic_shapes=dims)
    assert 'forward' not in vars(head.up)  # the module's own forward is back
    torch.testing.assert_close(exported.module()(other), head(other), rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('family', sorted(TINY_BACKBONES))
def test_backbone_export_matches_pytorch(family, tmp_path):
    arch, extra, widths = TINY_BACKBONES[family]
    torch.manual_seed(0)
    model = MODELS.build(dict(type=family, arch=arch, **extra)).eval()
    path = str(tmp_path / f'{family}.onnx')
    result = export.export_onnx(model, EXPORT_HW, path)
    batch, _, h, w = result['ranges']
    assert batch[0] <= 2 and all(r[0] <= min(hw) for r in (h, w) for hw in VERIFY_HW)
    rows = verify.verify_onnx(model, path, VERIFY_HW)
    _check(rows)
    print(family, verify.format_rows(rows))


@pytest.mark.slow
def test_cli_exports_a_segmentor_in_tensor_mode(tmp_path):
    """The tool as a user runs it: whole Semantic FPN segmentor, tensor mode, --verify."""
    config = tiny_sem_fpn(tmp_path)
    out = str(tmp_path / 'seg.onnx')
    shapes = [str(s) for hw in VERIFY_HW for s in hw]
    rc, text, _ = run_tool([PYTHON, osp.join(REPO, 'tools/deployment/pytorch2onnx.py'), config,
                            '--out', out, '--shape', *map(str, EXPORT_HW), '--verify',
                            '--verify-shapes', *shapes], timeout=3600)
    ok(rc, text)
    assert osp.isfile(out)
    assert 'segmentor (tensor mode)' in text and 'Verified at 61x83, 77x101' in text
    # 150 ADE20K classes at stride 4 of 61x83
    assert '| 1 | 61x83 | 0 | 1x150x16x21 |' in text


def test_cli_rejects_bad_input(tmp_path, capsys):
    """One message, exit status 1 and no traceback (the tool's main, in process)."""
    config = tiny_sem_fpn(tmp_path)
    err = tool_failure(pytorch2onnx.main, [config, '--out', str(tmp_path / 'x.onnx'),
                                           '--shape', '64', '96',
                                           '--verify-shapes', '61', '83', '77'], capsys)
    assert '--verify-shapes takes H W pairs' in err
    err = tool_failure(pytorch2onnx.main, [config, '--out', str(tmp_path / 'x.onnx'),
                                           '--shape', '64', '96',
                                           '--checkpoint', str(tmp_path / 'none.pth')], capsys)
    assert 'Checkpoint not found' in err
