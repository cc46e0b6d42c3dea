"""InLine attention in padded windows: padded tokens must not reach any InLine statistic.

The kernel's key mask against the masked explicit definition, and WindowAttention('I')
on maps that are not whole windows against each window's real tokens run alone.
"""
import pytest
import torch

from mmplugin_inline.core import (
    inline_attention,
    inline_attention_reference,
    inline_attention_weights,
    local_residual_reference,
)
from mmplugin_inline.models.layers import CSWinBranch, WindowAttention
from mmplugin_inline.models.layers.window_attention import padding_real_mask

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def _qkv_mask(seed, b, h, n, d, dtype, per_head=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_()
               for _ in range(3))
    mask = torch.rand(*((b, h, n) if per_head else (b, n)), generator=g) < 0.6
    mask[..., 0] = True                   # at least one key per group ...
    mask[-1, ..., 1:] = False             # ... and a group with exactly one
    return q, k, v, mask


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('kernel', ['identity', 'relu', 'exp'])
@pytest.mark.parametrize('seed,n,d,per_head', [(0, 37, 13, False), (1, 16, 8, True),
                                               (2, 3, 5, False)])
def test_masked_kernel_matches_masked_definition_forward_backward(dtype, kernel, seed, n, d,
                                                                  per_head):
    q, k, v, mask = _qkv_mask(seed, 3, 2, n, d, dtype, per_head)
    out = inline_attention(q, k, v, kernel=kernel, real_keys=mask)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref = inline_attention_reference(q, k, v, kernel=kernel, real_keys=mask)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, **TOL[dtype])
    # masked keys and values get no gradient
    hidden = ~(mask if per_head else mask[:, None].expand(-1, 2, -1))
    assert (grads[1][hidden] == 0).all() and (grads[2][hidden] == 0).all()


def test_masked_definition_is_the_definition_over_the_valid_keys():
    q, k, v, mask = _qkv_mask(3, 2, 2, 11, 4, torch.float64)
    with torch.no_grad():
        w = inline_attention_weights(q, k, real_keys=mask)
        for b in range(2):
            idx = mask[b].nonzero().flatten()
            alone = inline_attention_weights(q[b:b + 1], k[b:b + 1, :, idx])[0]
            torch.testing.assert_close(w[b][..., idx], alone)
            assert (w[b][..., ~mask[b]] == 0).all()
            torch.testing.assert_close(inline_attention(q, k, v, real_keys=mask)[b],
                                       inline_attention(q[b:b + 1], k[b:b + 1, :, idx],
                                                        v[b:b + 1, :, idx])[0])


def test_bad_key_mask_shape_is_named():
    q, k, v, _ = _qkv_mask(4, 2, 2, 5, 4, torch.float64)
    with pytest.raises(ValueError, match=r'real_keys must be \[B, N\]'):
        inline_attention(q, k, v, real_keys=torch.ones(2, 4, dtype=torch.bool))


def _per_window_reference(attn, x, hw, ws):
    """Each window's real tokens cut out and run alone through the unmasked definition."""
    b, _, c = x.shape
    h, w = hw
    heads = attn.num_heads
    xm = x.view(b, h, w, c)
    out = torch.zeros(b, h, w, c, dtype=x.dtype)
    split = lambda t: t.view(b, -1, heads, c // heads).transpose(1, 2)  # noqa: E731
    for top in range(0, h, ws):
        for left in range(0, w, ws):
            cut = xm[:, top:top + ws, left:left + ws]              # real tokens only
            rh, rw = cut.shape[1:3]
            tokens = cut.reshape(b, rh * rw, c)
            q, k, v = attn.qkv(tokens).chunk(3, dim=-1)
            att = inline_attention_reference(split(q), split(k), split(v))
            att = att.transpose(1, 2).reshape(b, rh * rw, c)
            kernels = attn.mixer.residual(tokens.mean(dim=1))
            res = local_residual_reference(v.transpose(1, 2).reshape(b, c, rh, rw), kernels)
            out[:, top:top + rh, left:left + rw] = (att + res.flatten(2).transpose(1, 2)).view(
                b, rh, rw, c)
    return attn.proj(out.view(b, h * w, c))


# 6x7 / window 4: the case; 5x9 / window 4: a bottom-right window with one real
# token and border windows of one row or column; 3x2 / window 4: one window, mostly padding
@pytest.mark.parametrize('hw,ws', [((6, 7), 4), ((5, 9), 4), ((3, 2), 4)])
def test_inline_windows_on_padded_maps_match_each_window_alone(hw, ws):
    torch.manual_seed(5)
    c, heads = 8, 2
    attn = WindowAttention(c, heads, 'I', window_size=ws).double().eval()
    x = torch.randn(2, hw[0] * hw[1], c, dtype=torch.float64, requires_grad=True)
    out = attn(x, hw)
    ref = _per_window_reference(attn, x, hw, ws)
    torch.testing.assert_close(out, ref)
    grad_out = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, x, grad_out)[0],
                               torch.autograd.grad(ref, x, grad_out)[0])


def test_unpadded_windows_take_the_unmasked_path():
    assert padding_real_mask((8, 12), (8, 12), (4, 4), 2) is None
    mask = padding_real_mask((8, 8), (6, 7), (4, 4), 2)
    assert mask.shape == (8, 16) and mask.dtype == torch.bool
    assert mask[:4].sum(1).tolist() == [16, 12, 8, 6]          # windows batch-major
    torch.testing.assert_close(mask[4:], mask[:4])


def test_shifted_inline_windows_and_inline_stripes_are_rejected():
    with pytest.raises(ValueError, match="shifted windows are softmax only"):
        WindowAttention(8, 2, 'I', window_size=4, shift=True)
    with pytest.raises(ValueError, match="attend over the whole map: use stripe=None"):
        CSWinBranch(8, 2, 'I', stripe=(3, True))
