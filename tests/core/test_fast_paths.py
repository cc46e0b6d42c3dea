"""Every fast form against its reference, forward and backward, in fp64.

The local residual's forms and the kernel predictor's products against the
convolutions they replace; the mask cache against masks built afresh (the cache and the
linear layers' library are what ``mmplugin_inline.core.reference_paths()`` switches; the
benchmark races the two).
"""
import pytest
import torch
import torch.nn.functional as F

import mmplugin_inline  # noqa: F401  (registers the backbones)
from helpers.tiny_models import TINY_BACKBONES
from mmplugin_inline.core import (
    depthwise_conv_taps,
    fast_paths_enabled,
    local_residual,
    local_residual_nhwc,
    local_residual_reference,
    local_residual_taps,
    reference_paths,
)
from mmplugin_inline.models.layers import ResidualKernelPredictor, WindowAttention
from mmplugin_inline.models.layers import window_attention as wa
from mmplugin_inline.registry import MODELS

TOL = dict(rtol=1e-10, atol=1e-10)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _grads(fn, inputs, params=()):
    """Output of ``fn()`` and the gradients of a fixed random projection of it."""
    for t in list(inputs) + list(params):
        t.grad = None
    out = fn()
    weight = torch.randn(out.shape, generator=_gen(99), dtype=out.dtype)
    (out * weight).sum().backward()
    return out.detach(), [t.grad.clone() for t in list(inputs) + list(params)]


def _assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], **TOL)
    assert len(a[1]) == len(b[1])
    for ga, gb in zip(a[1], b[1]):
        torch.testing.assert_close(ga, gb, **TOL)


def test_switch_restores_itself():
    assert fast_paths_enabled()
    with reference_paths():
        assert not fast_paths_enabled()
        with reference_paths(False):
            assert fast_paths_enabled()
        assert not fast_paths_enabled()
    assert fast_paths_enabled()


# -- local residual -----------------------------------------------------------------------------

@pytest.mark.parametrize('b,h,w,c', [(1, 7, 9, 5), (3, 12, 5, 4), (2, 1, 1, 3), (1, 14, 14, 6)])
def test_channels_last_residual_matches_reference(b, h, w, c):
    g = _gen(b * 100 + h)
    # a strided view, as the models pass it: the values third of a qkv projection
    qkv = torch.randn(b, h, w, 3 * c, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(b, c, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    fast = _grads(lambda: local_residual_nhwc(qkv[..., 2 * c:], weights), [qkv, weights])
    ref = _grads(lambda: local_residual_reference(
        qkv[..., 2 * c:].permute(0, 3, 1, 2), weights).permute(0, 2, 3, 1), [qkv, weights])
    grouped = _grads(lambda: local_residual(
        qkv[..., 2 * c:].permute(0, 3, 1, 2), weights).permute(0, 2, 3, 1), [qkv, weights])
    taps = _grads(lambda: local_residual_taps(qkv[..., 2 * c:], weights), [qkv, weights])
    _assert_same(fast, ref)
    _assert_same(grouped, ref)
    _assert_same(taps, ref)  # the form torch.export traces
    assert fast[0].shape == (b, h, w, c)


def test_channels_last_residual_rejects_wrong_kernel_shape():
    with pytest.raises(ValueError, match=r'\[B, C, 3, 3\]'):
        local_residual_nhwc(torch.zeros(2, 5, 5, 4), torch.zeros(2, 4, 9))


@pytest.mark.parametrize('hw,k,pad', [((7, 9), 3, (1, 1)), ((1, 1), 3, (1, 1)),
                                      ((6, 5), 5, (2, 2)), ((4, 7), 3, (0, 1))])
def test_depthwise_taps_equal_the_convolution(hw, k, pad):
    g = _gen(5)
    x = torch.randn(2, 6, *hw, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 1, k, k, generator=g, dtype=torch.float64, requires_grad=True)
    _assert_same(_grads(lambda: depthwise_conv_taps(x, w, pad), [x, w]),
                 _grads(lambda: F.conv2d(x, w, padding=pad, groups=6), [x, w]))


# -- kernel predictor ---------------------------------------------------------------------------

@pytest.mark.parametrize('dim,heads,batch', [(12, 3, 2), (8, 1, 1), (16, 4, 5)])
def test_kernel_predictor_products_match_the_convolutions(dim, heads, batch):
    torch.manual_seed(dim)
    pred = ResidualKernelPredictor(dim, heads).double()
    x = torch.randn(batch, dim, dtype=torch.float64, requires_grad=True)
    params = list(pred.parameters())
    fast = _grads(lambda: pred(x), [x], params)
    # the reference: the two Conv1d modules on a length-1 sequence
    ref = _grads(lambda: torch.nn.Sequential.forward(pred, x.unsqueeze(-1)).view(
        batch, dim, 3, 3), [x], params)
    _assert_same(fast, ref)
    assert fast[0].shape == (batch, dim, 3, 3)


# -- whole backbones: cached masks and the linear layers' library vs the references -------------

@pytest.mark.parametrize('family', sorted(TINY_BACKBONES))
def test_tiny_backbones_paths_agree(family):
    """Whole backbones (every block type of the family's preset), odd input size."""
    arch, extra, _ = TINY_BACKBONES[family]
    torch.manual_seed(0)
    cfg = dict(type=family, arch=dict(arch), init_cfg=None, drop_path_rate=0.0, **extra)
    if family == 'InLineSwinTransformer':
        cfg['block_types'] = 'IIMS2'
    if family == 'InLineDeiT':
        cfg['out_indices'] = (3, 11)
    model = MODELS.build(cfg).double().train()
    x = torch.randn(2, 3, 45, 61, dtype=torch.float64, requires_grad=True)
    params = [p for p in model.parameters() if p.requires_grad]

    def run():
        return torch.cat([o.flatten(1) for o in model(x)], dim=1)
    fast = _grads(run, [x], params)
    with reference_paths():
        ref = _grads(run, [x], params)
    _assert_same(fast, ref)


# -- the mask cache ------------------------------------------------------------------------------

def test_masks_are_built_once_per_size_and_equal_the_built_ones():
    args = ((14, 14), (12, 13), (7, 7), (3, 3))
    first = wa.shifted_window_mask(*args)
    assert wa.shifted_window_mask(*args) is first           # cached
    torch.testing.assert_close(first, wa._shifted_window_mask(*args, None))
    with reference_paths():
        built = wa.shifted_window_mask(*args)
    assert built is not first
    torch.testing.assert_close(built, first)
    other = wa.shifted_window_mask((14, 14), (14, 14), (7, 7), (3, 3))
    assert other is not first and not torch.equal(other, first)
    keys = ((9, 12), (7, 10), (3, 4), 2)
    valid = wa.padding_real_mask(*keys)
    assert wa.padding_real_mask(*keys) is valid
    assert torch.equal(valid, wa._padding_real_mask(*keys, None))
    assert wa.padding_real_mask((9, 12), (9, 12), (3, 4), 2) is None


def test_a_mask_cached_under_inference_mode_serves_training():
    """A mask first built under ``torch.inference_mode`` must not be an inference tensor:
    a later training forward saves it for its backward."""
    wa._mask_cache.clear()
    torch.manual_seed(0)
    attn = WindowAttention(8, 2, 'I', window_size=4)
    x = torch.randn(1, 6 * 7, 8)
    with torch.inference_mode():
        attn(x, (6, 7))
    x.requires_grad_()
    attn(x, (6, 7)).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_mask_cache_is_bounded():
    wa._mask_cache.clear()
    for i in range(wa.MASK_CACHE_SIZE + 10):
        wa.shifted_window_mask((8, 8 + 4 * i), (8, 8 + 4 * i), (4, 4), (2, 2))
    assert len(wa._mask_cache) == wa.MASK_CACHE_SIZE
