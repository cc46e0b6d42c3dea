"""Mixed precision: every family under autocast, and the kernel's statistics in fp16.

Bounds come from the unit roundoff u of the low-precision type (bf16 2^-8, fp16 2^-11):
one rounding perturbs the tensor it rounds by at most u of its magnitude. Under
autocast each matmul / conv rounds its input, its weight and its output (3 roundings),
the InLine kernel only its output (it accumulates in fp32), and the backward repeats
the path (x2). Errors are measured against the same computation in fp32, relative to
the fp32 tensor's largest magnitude:

- one attention layer at 67,200 tokens (worst-case, roundings add up):
  ``max|err| <= L u`` for the outputs, ``2 L u`` for every gradient, with L the
  roundings on the layer's longest path (residual-kernel predictor conv1d, conv1d,
  local-residual conv2d, proj: 4 x 3, + 1 for the kernel) = 13;
- whole tiny backbones (a few hundred roundings; independent rounding errors add in
  quadrature, the standard probabilistic model): ``max|err| <= sqrt(L) u`` for every
  output and the input gradient (``sqrt(2 L) u``), with L = 3 x the number of matmul /
  conv layers of the backbone (more than any path holds); the parameter gradients as
  one vector (what the optimizer steps with), in norm, ``sqrt(2 L) u``.

Observed on CPU bf16 (these seeds): layers at 67,200 tokens 1.3-1.5 u on outputs, 3.6-7.5 u
on the worst gradient (bounds 13 u / 26 u); tiny backbones (L = 87-219) 0.7-2.8 u on
outputs (bounds 9.3-14.8 u), 1.0-2.2 u on the input gradient and 0.75-2.0 u on the
parameter gradients (bounds 13.2-20.9 u). The CUDA cases (fp16, bf16) run the same code
and skip without a GPU (run on the CPU in fp16, they passed the same bounds).
"""
import math

import pytest
import torch

from helpers.tiny_models import TINY_BACKBONES
from mmplugin_inline.core import inline_attention
from mmplugin_inline.registry import MODELS, registered_families

FAMILIES = sorted(registered_families())
HAS_CUDA = torch.cuda.is_available()
#: unit roundoff: the largest relative error of one rounding to nearest
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
STAGE1 = (200, 336)  # InLine-PVT's stage-1 map for an 800 x 1344 image: 67,200 tokens
_cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason='needs a CUDA device')]
#: (device, autocast dtype): bf16 on CPU (fp16 autocast on CPU is no use), both on CUDA
AUTOCAST_CASES = [
    pytest.param('cpu', torch.bfloat16, id='cpu-bf16'),
    pytest.param('cuda', torch.float16, id='cuda-fp16', marks=_cuda),
    pytest.param('cuda', torch.bfloat16, id='cuda-bf16', marks=_cuda),
]


class fp32_without_tf32:
    """fp32 references on CUDA must not use TF32 (cuDNN convs default to it)."""

    def __enter__(self):
        self.saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.saved


def relative_error(low, ref) -> float:
    """max |low - ref| / max |ref| (both finite, or inf)."""
    low, ref = low.double(), ref.double()
    if not torch.isfinite(low).all():
        return math.inf
    return ((low - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def seeded_grads(outs):
    """The same random output gradients for the same output shapes (fp32, on their device)."""
    g = torch.Generator().manual_seed(2)
    return [torch.randn(o.shape, generator=g).to(o.device) for o in outs]


def run_fwd_bwd(module, inputs, grad_outs=seeded_grads, dtype=None):
    """Outputs (as a list), d(sum <out, grad_out>)/d(first input) and parameter
    gradients, under autocast to ``dtype`` (None: fp32); ``grad_outs(outputs)`` gives
    the output gradients."""
    device = inputs[0].device.type
    x = inputs[0].detach().clone().requires_grad_()
    with fp32_without_tf32(), torch.autocast(device, dtype=dtype or torch.float32,
                                             enabled=dtype is not None):
        outs = module(x, *inputs[1:])
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    loss = sum((o.float() * g).sum() for o, g in zip(outs, grad_outs(outs)))
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [x] + params, allow_unused=True)
    return outs, grads[0], [torch.zeros_like(p) if g is None else g
                            for p, g in zip(params, grads[1:])]


# -- the kernel: fp16 statistics at 67k tokens and magnitude 1e3 ------------------------

def _offset_qkv(n, mu=1e3, d=32, heads=2, seed=0):
    """q, k, v of magnitude ``mu`` (a common offset, spread 1, V correlated with K)."""
    g = torch.Generator().manual_seed(seed)
    q = mu + torch.randn(1, heads, n, d, generator=g)
    k = mu + torch.randn(1, heads, n, d, generator=g)
    v = mu + 0.5 * (k - mu) + 0.5 * torch.randn(1, heads, n, d, generator=g)
    return q, k, v


def test_fp16_statistics_at_67k_tokens_and_magnitude_1e3_do_not_overflow():
    """fp16 inputs: the kernel's sums (~N mu^2 = 6.7e10 >> fp16's 65504) run in fp32,
    centred; the result, rounded once to fp16, is within 2x the rounding floor of the
    fp64 result on the same inputs (one rounding <= 1 floor; the fp32 error, ~1e-6
    relative, is far below fp16's half ulp). Gradients alike."""
    n = STAGE1[0] * STAGE1[1]
    q, k, v = (t.half().requires_grad_() for t in _offset_qkv(n))
    out = inline_attention(q, k, v)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).half()
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    exact = inline_attention(q64, k64, v64)
    exact_grads = torch.autograd.grad(exact, (q64, k64, v64), grad_out.double())
    assert out.dtype == torch.float16
    for low, ref in zip((out,) + grads, (exact,) + exact_grads):
        assert torch.isfinite(low).all()
        floor = (ref.half().double() - ref).abs().max()
        ratio = ((low.double() - ref).abs().max() / floor).item()
        assert ratio <= 2.0, f'error is {ratio:.2f}x the fp16 rounding floor'

    # the failure this guards against: the same statistics kept in fp16 overflow
    kh, vh = k.detach(), v.detach()
    assert not torch.isfinite(kh.transpose(-2, -1) @ vh).all()          # K^T V
    assert not torch.isfinite(kh.sum(dim=2)).all()                      # N * mean(K)


# -- every family's stage-1 attention layer at 67,200 tokens ----------------------------

def first_attention_layer(family: str):
    """The InLine attention layer of the first block of the family's 't' preset (real
    stage-1 width and heads), in a preset shrunk to one block per stage; and its width."""
    cls = MODELS.get(family)
    arch = dict(cls.arch_settings['t'])
    if family == 'InLineDeiT':
        model = cls(arch=dict(arch, depth=1), out_indices=(0,), drop_path_rate=0.0)
    else:
        model = cls(arch=dict(arch, depths=[1] * len(arch['depths'])), drop_path_rate=0.0)
    block = model.stages[0].blocks[0]
    return block, block.norm1.normalized_shape[0]


class _Attention(torch.nn.Module):
    """A block's attention as a module of (tokens, hw) alone (CSWin reads the block input)."""

    def __init__(self, block):
        super().__init__()
        self.attn = block.attn
        self.pass_input = block.pass_block_input

    def forward(self, x, hw):
        return self.attn(x, hw, shortcut=x) if self.pass_input else self.attn(x, hw)


@pytest.mark.parametrize('device,dtype', AUTOCAST_CASES)
@pytest.mark.parametrize('family', FAMILIES)
def test_stage1_attention_layer_under_autocast_at_67k_tokens(family, device, dtype):
    """PVT, Swin and CSWin run these layers on 200 x 336 tokens for an 800 x 1344 image;
    DeiT sees 50 x 84 there (stride 16) but runs here at the same count, cls token
    included, so every family's layer meets the largest sums. Bound: module docstring."""
    torch.manual_seed(0)
    block, width = first_attention_layer(family)
    layer = _Attention(block).to(device)
    assert {m.attn_type for m in layer.modules() if hasattr(m, 'attn_type')} == {'I'}
    n = STAGE1[0] * STAGE1[1] + (1 if family == 'InLineDeiT' else 0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, n, width, generator=g).to(device)
    ref_out, ref_gx, ref_gp = run_fwd_bwd(layer, (x, STAGE1))
    low_out, low_gx, low_gp = run_fwd_bwd(layer, (x, STAGE1), dtype=dtype)
    u, path = UNIT_ROUNDOFF[dtype], 13
    err = relative_error(low_out[0], ref_out[0])
    assert err <= path * u, f'output error {err / u:.2f} u > {path} u'
    for name, low, ref in [('input', low_gx, ref_gx)] + [
            (n, a, b) for (n, _), a, b in zip(layer.named_parameters(), low_gp, ref_gp)]:
        err = relative_error(low, ref)
        assert err <= 2 * path * u, f'gradient of {name}: error {err / u:.2f} u > {2 * path} u'


# -- whole tiny backbones ----------------------------------------------------------------

def tiny_backbone(family, **kw):
    arch, extra, _ = TINY_BACKBONES[family]
    torch.manual_seed(0)
    return MODELS.build(dict(type=family, arch=arch, drop_path_rate=0.0, **extra, **kw))


def rounding_count(model) -> int:
    """3 roundings (input, weight, output) per matmul / conv layer of the model."""
    layers = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)
    return 3 * sum(isinstance(m, layers) for m in model.modules())


@pytest.mark.parametrize('device,dtype', AUTOCAST_CASES)
@pytest.mark.parametrize('family', FAMILIES)
def test_tiny_backbone_under_autocast(family, device, dtype):
    """Forward and backward of a whole tiny backbone at 72 x 104 (odd strides: padding
    inside), finite, fp32 outputs, within the bounds of the module docstring."""
    model = tiny_backbone(family).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 72, 104, generator=g).to(device)
    ref_outs, ref_gx, ref_gp = run_fwd_bwd(model, (x,))
    low_outs, low_gx, low_gp = run_fwd_bwd(model, (x,), dtype=dtype)
    u, count = UNIT_ROUNDOFF[dtype], rounding_count(model)
    fwd_bound, bwd_bound = math.sqrt(count) * u, math.sqrt(2 * count) * u
    for i, (low, ref) in enumerate(zip(low_outs, ref_outs)):
        assert low.dtype == torch.float32 and low.is_contiguous()
        err = relative_error(low, ref)
        assert err <= fwd_bound, f'output {i}: error {err / u:.2f} u > {fwd_bound / u:.1f} u'
    err = relative_error(low_gx, ref_gx)
    assert err <= bwd_bound, f'input gradient: error {err / u:.2f} u > {bwd_bound / u:.1f} u'
    assert all(torch.isfinite(p).all() for p in low_gp)
    low_flat, ref_flat = torch.cat([p.flatten() for p in low_gp]), \
        torch.cat([p.flatten() for p in ref_gp])
    err = ((low_flat - ref_flat).norm() / ref_flat.norm()).item()
    assert err <= bwd_bound, f'parameter gradients: error {err / u:.2f} u > {bwd_bound / u:.1f} u'


@pytest.mark.parametrize('family', FAMILIES)
def test_output_dtype_policy_outside_autocast(family):
    """Under autocast the outputs are fp32 (test_tiny_backbone_under_autocast, as mmdet's
    Swin / PVT under CUDA autocast); outside it they keep the dtype the model computes
    in: a bf16 model gives bf16."""
    model = tiny_backbone(family).eval().to(torch.bfloat16)
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 40, 56, dtype=torch.bfloat16))
    assert {o.dtype for o in outs} == {torch.bfloat16}
