"""ONNX export of the mixer variants: a tiny model with plain linear attention blocks ('L')
and InLine blocks without their local residual exports and verifies in onnxruntime at
sizes that are not multiples of 32."""
import pytest
import torch

from helpers.tiny_models import TINY_BACKBONES
from mmplugin_inline.deployment import onnx as export
from mmplugin_inline.deployment import verify
from mmplugin_inline.registry import MODELS

pytest.importorskip('onnxruntime')


@pytest.mark.slow
@pytest.mark.parametrize('block_types,local_residual', [('LLSL', True), ('ILIL', False)])
def test_linear_blocks_export_and_verify(block_types, local_residual, tmp_path):
    arch, extra, _ = TINY_BACKBONES['InLinePVT']
    torch.manual_seed(0)
    model = MODELS.build(dict(type='InLinePVT', arch=arch, **dict(extra, block_types=block_types),
                              local_residual=local_residual)).eval()
    blocks = model.stages[1].blocks
    assert [b.attn.attn_type for b in blocks] == [block_types[1]] * len(blocks)
    path = str(tmp_path / 'pvt.onnx')
    export.export_onnx(model, (64, 96), path)
    rows = verify.verify_onnx(model, path, [(61, 83), (77, 101)])
    assert {r['hw'] for r in rows} == {(61, 83), (77, 101)}
    assert verify.check_rows(rows, 1e-4) is None, verify.check_rows(rows, 1e-4)
