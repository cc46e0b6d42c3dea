"""Mixed precision: the kernel's statistics in fp16 at 67k tokens."""
import torch

from mmplugin_inline.core import inline_attention

STAGE1 = (200, 336)  # InLine-PVT's stage-1 map for an 800 x 1344 image: 67,200 tokens


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
