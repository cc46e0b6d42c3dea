"""The kernels of mmplugin_inline.core against their explicit references."""
import pytest
import torch
import torch.nn.functional as F

from mmplugin_inline.core import (
    ATTENTION_WEIGHTS,
    FEATURE_MAPS,
    crop_to,
    inline_attention,
    inline_attention_authors,
    inline_attention_reference,
    inline_attention_weights,
    linear_attention,
    linear_attention_reference,
    local_residual,
    local_residual_reference,
    nchw_to_nlc,
    nlc_to_nchw,
    pad_to_multiple,
    softmax_attention,
    softmax_attention_reference,
    stripe_partition,
    stripe_reverse,
    window_partition,
    window_reverse,
)

KERNEL_NAMES = sorted(FEATURE_MAPS)
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def _qkv(seed, b=2, h=3, n=37, d=13, dtype=torch.float64, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_(requires_grad)
            for _ in range(3)]


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('kernel', KERNEL_NAMES)
@pytest.mark.parametrize('seed,n,d', [(0, 37, 13), (1, 50, 8), (2, 1, 5), (3, 129, 32)])
def test_inline_matches_reference_forward_backward(dtype, kernel, seed, n, d):
    q, k, v = _qkv(seed, n=n, d=d, dtype=dtype, requires_grad=True)
    out = inline_attention(q, k, v, kernel=kernel)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref = inline_attention_reference(q, k, v, kernel=kernel)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, **TOL[dtype])
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, **TOL[dtype])


def test_reference_weights_are_the_definition():
    q, k, _ = _qkv(4, n=9, d=4)
    s = 4 ** -0.5
    w = inline_attention_weights(q, k)
    # element-wise transcription of w_ij = 1/N + (s/N) q_i . (k_j - mean k)
    k_mean = k.mean(dim=2)
    for i in (0, 5):
        for j in (0, 8):
            expect = 1 / 9 + (s / 9) * (q[1, 2, i] * (k[1, 2, j] - k_mean[1, 2])).sum()
            torch.testing.assert_close(w[1, 2, i, j], expect)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


@pytest.mark.parametrize('kernel', KERNEL_NAMES)
def test_constant_values_pass_through(kernel):
    q, k, _ = _qkv(5, n=31, d=6)
    v = torch.full((2, 3, 31, 6), 2.5, dtype=torch.float64)
    torch.testing.assert_close(inline_attention(q, k, v, kernel=kernel), v)


def test_authors_formulation_agrees_in_fp64():
    q, k, v = _qkv(6, n=45, d=16)
    torch.testing.assert_close(inline_attention_authors(q, k, v), inline_attention(q, k, v))


def test_queries_and_values_of_other_lengths():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 11, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 29, 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 29, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(inline_attention(q, k, v), inline_attention_reference(q, k, v))


def test_bad_shapes_are_named():
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match=r'\[B, heads, N, d\]'):
        inline_attention(q[0], k, v)
    with pytest.raises(ValueError, match='do not agree'):
        inline_attention(q, k[..., :5], v)
    with pytest.raises(ValueError, match='unknown attention kernel'):
        inline_attention(q, k, v, kernel='tanh')


@pytest.mark.parametrize('kernel', ['relu', 'exp'])
def test_linear_attention_fast_matches_reference(kernel):
    q, k, v = _qkv(8, n=40, d=7)
    torch.testing.assert_close(linear_attention(q, k, v, kernel=kernel),
                               linear_attention_reference(q, k, v, kernel=kernel))


def test_softmax_sdpa_matches_reference():
    q, k, v = _qkv(9, n=33, d=12)
    torch.testing.assert_close(softmax_attention(q, k, v), softmax_attention_reference(q, k, v))


#: variant name -> its fast function, with the (q, k, v, kernel=...) calling convention
ATTENTION_FUNCTIONS = {
    'inline': inline_attention,
    'linear': linear_attention,
    'softmax': softmax_attention,
}


def test_swappable_registries_share_the_calling_convention():
    q, k, v = _qkv(10, n=20, d=4)
    assert set(ATTENTION_FUNCTIONS) == set(ATTENTION_WEIGHTS)  # every variant has both forms
    for name, fn in ATTENTION_FUNCTIONS.items():
        w = ATTENTION_WEIGHTS[name](q, k, kernel='relu')
        torch.testing.assert_close(fn(q, k, v, kernel='relu'), w @ v, rtol=1e-6, atol=1e-6)


# -- numerics in low precision ------------------------------------------------------------

def _correlated_inputs(mu, n=200 * 336, d=32, heads=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n, d, generator=g) + mu
    k = torch.randn(1, heads, n, d, generator=g) + mu
    v = 0.5 * (k - mu) + 0.5 * torch.randn(1, heads, n, d, generator=g) + mu  # V correlated with K
    return q, k, v


def _error_ratio(fn, q, k, v, dtype, autocast):
    """max |fn(lowp) - exact| / max |round(exact) - exact| on the same rounded inputs."""
    ql, kl, vl = (t.to(dtype) for t in (q, k, v))
    exact = inline_attention(ql.double(), kl.double(), vl.double())
    floor = (exact.to(dtype).double() - exact).abs().max()
    if autocast:
        with torch.autocast('cpu', dtype=dtype):
            out = fn(ql.float(), kl.float(), vl.float()) if fn is not inline_attention else \
                fn(ql, kl, vl)
    else:
        out = fn(ql, kl, vl)
    return ((out.double() - exact).abs().max() / floor).item(), out.dtype


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('mu', [0.0, 1.0, 4.0])
@pytest.mark.parametrize('autocast', [False, True])
def test_low_precision_error_stays_near_the_rounding_floor(dtype, mu, autocast):
    q, k, v = _correlated_inputs(mu)
    ratio, out_dtype = _error_ratio(inline_attention, q, k, v, dtype, autocast)
    assert out_dtype == dtype
    assert ratio <= 3.0, f'error is {ratio:.2f}x the rounding floor'


def test_authors_formulation_is_worse_in_bf16_at_an_offset():
    """The failure mode the centred fp32 kernel avoids (documents why it exists)."""
    q, k, v = _correlated_inputs(4.0)
    ratio, _ = _error_ratio(inline_attention_authors, q, k, v, torch.bfloat16, False)
    ours, _ = _error_ratio(inline_attention, q, k, v, torch.bfloat16, False)
    assert ratio > 10 * ours


# -- local residual -------------------------------------------------------------------------

@pytest.mark.parametrize('hw', [(7, 9), (1, 1), (12, 5)])
def test_local_residual_matches_per_sample_loop(hw):
    g = torch.Generator().manual_seed(11)
    v = torch.randn(3, 5, *hw, generator=g, dtype=torch.float64)
    w = torch.randn(3, 5, 3, 3, generator=g, dtype=torch.float64)
    out = local_residual(v, w)
    torch.testing.assert_close(out, local_residual_reference(v, w))
    # and against F.conv2d one sample and one channel at a time
    i, c = 2, 4
    single = F.conv2d(v[i:i + 1, c:c + 1], w[i, c].view(1, 1, 3, 3), padding=1)
    torch.testing.assert_close(out[i:i + 1, c:c + 1], single)


def test_local_residual_rejects_wrong_kernel_shape():
    with pytest.raises(ValueError, match=r'\[B, C, 3, 3\]'):
        local_residual(torch.zeros(2, 4, 5, 5), torch.zeros(2, 4, 9))


# -- token plumbing -----------------------------------------------------------------------------

@pytest.mark.parametrize('hw,win', [((13, 17), (7, 7)), ((7, 7), (7, 7)), ((5, 23), (2, 6))])
def test_pad_window_partition_reverse_crop_is_identity(hw, win):
    x = torch.randn(2, *hw, 3)
    xp, orig = pad_to_multiple(x, win)
    assert xp.shape[1] % win[0] == 0 and xp.shape[2] % win[1] == 0
    windows = window_partition(xp, win)
    assert windows.shape[1:] == (win[0] * win[1], 3)
    back = crop_to(window_reverse(windows, win, xp.shape[1:3]), orig)
    torch.testing.assert_close(back, x)


def test_window_partition_order_is_row_major():
    x = torch.arange(16.).view(1, 4, 4, 1)
    w = window_partition(x, (2, 2))
    assert w[1, :, 0].tolist() == [2., 3., 6., 7.]


@pytest.mark.parametrize('vertical', [True, False])
def test_stripes_roundtrip_and_shape(vertical):
    x = torch.randn(2, 11, 13, 4)
    xp, orig = pad_to_multiple(x, (1, 3) if vertical else (3, 1))
    s = stripe_partition(xp, 3, vertical)
    n_stripes = xp.shape[2] // 3 if vertical else xp.shape[1] // 3
    assert s.shape[0] == 2 * n_stripes
    torch.testing.assert_close(crop_to(stripe_reverse(s, 3, vertical, xp.shape[1:3]), orig), x)


def test_pad_nchw_and_layout_roundtrip():
    x = torch.randn(1, 3, 5, 6)
    xp, orig = pad_to_multiple(x, (4, 4), channels_last=False)
    assert xp.shape == (1, 3, 8, 8) and xp[:, :, 5:].abs().sum() == 0
    torch.testing.assert_close(crop_to(xp, orig, channels_last=False), x)
    torch.testing.assert_close(nlc_to_nchw(nchw_to_nlc(x), (5, 6)), x)
    with pytest.raises(ValueError, match='cannot form'):
        nlc_to_nchw(nchw_to_nlc(x), (4, 6))
