"""The fast InLine attention kernel: O(N d^2) time, O(N d) memory, never an N x N tensor.

For one head with N tokens, width d and s = d^-0.5 (see ``core/README.md``)::

    out_i = mean(V) + (s / N) * phi(q_i) @ M,   M = (phi(K) - mean phi(K))^T V   [d, d]

and because the centred keys sum to zero, M = (phi(K) - mean)^T (V - mean(V)): two
column means, then one N-long matmul of centred operands. (The expanded form
phi(K)^T V - N mean(phi(K)) mean(V)^T is equal in exact arithmetic, but its two terms
grow as N mu^2 at a common offset mu and cancel: at mu = 1e3 and 67k tokens fp32 keeps
no correct digit.) All of it runs in fp32 (fp64 stays fp64) with autocast off; the
result comes back in the input dtype.

With a ``real_keys`` (padded windows), the masked keys leave every statistic: N is the
number of valid keys of each group, and the masked rows of phi(K) and V are zeroed
before the means and the product (``core/README.md``, "Masked keys").
"""
from typing import Optional

import torch

from .feature_maps import get_feature_map


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half precision inputs are accumulated in fp32; fp32 / fp64 keep their dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError('q, k, v must be [B, heads, N, d] tensors, got shapes '
                         f'{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}')
    if k.shape[:3] != v.shape[:3] or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError('q, k, v shapes do not agree: q [B, h, Nq, d], k [B, h, N, d], '
                         f'v [B, h, N, dv] expected, got {tuple(q.shape)}, {tuple(k.shape)}, '
                         f'{tuple(v.shape)}')
    if k.shape[2] == 0:
        raise ValueError('InLine attention needs at least one key token (N = 0)')


def _real_keys_column(real_keys: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``real_keys`` ([B, N] or [B, heads, N]) as a 0 / 1 column [B * heads, N, 1]."""
    b, h, n, _ = k.shape
    if real_keys.dim() == 2:
        real_keys = real_keys.unsqueeze(1)
    if real_keys.dim() != 3 or real_keys.shape[0] != b or real_keys.shape[1] not in (1, h) \
            or real_keys.shape[2] != n:
        raise ValueError(f'real_keys must be [B, N] = [{b}, {n}] or [B, heads, N] = '
                         f'[{b}, {h}, {n}], got {tuple(real_keys.shape)}')
    return real_keys.to(dtype).expand(b, h, n).reshape(b * h, n, 1)


class _CentredLinearAttention(torch.autograd.Function):
    """``out = mean(V) + c * Q [K^T (I - 11^T/N) V]`` with a hand-written backward.

    Writing the backward out keeps it at four N x d x d matmuls and one N x d temporary
    at a time beyond the gradients: K and V are saved as they are and centred again, one
    at a time, for the product that needs them, and the mean row of dV is added in place
    (autograd would expand the mean's gradient into temporaries and add them in extra
    passes). Inputs are [G, N, d] (heads folded into G), already in the compute dtype.

    ``mask`` is None (every key counts) or a 0 / 1 column [G, N, 1] of the valid keys,
    with the invalid rows of k and v already zero: N is then each group's count of valid
    keys ([G, 1, 1]), the centred rows of the invalid keys are zeroed, and the same
    formulas hold (``core/README.md``, "Masked keys").
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, mask=None):
        # the scale is resolved here, not by the caller: a float derived from a
        # tensor's shape outside the Function breaks torch.jit tracing (FLOP counting)
        s = q.shape[-1] ** -0.5 if scale is None else scale
        if mask is None:
            n = k.shape[1]
            k_mean = k.mean(dim=1, keepdim=True)                   # [G, 1, d]
            v_mean = v.mean(dim=1, keepdim=True)                   # [G, 1, dv]
        else:
            n = mask.sum(dim=1, keepdim=True).clamp_min(1)         # [G, 1, 1] valid keys
            k_mean = k.sum(dim=1, keepdim=True) / n
            v_mean = v.sum(dim=1, keepdim=True) / n
        c = s / n
        # centred before the product: K^T V - N k_mean^T v_mean is the same in exact
        # arithmetic, but at a common offset mu both terms are ~N mu^2 and cancel
        # (fp32 loses everything at mu ~ 1e3, 67k tokens); (K - k_mean)^T (V - v_mean)
        # only sums terms of the spread's size
        kc = k - k_mean                                            # K - 1 k_mean^T
        vc = v - v_mean                                            # V - 1 v_mean^T
        if mask is not None:
            kc.mul_(mask)
            vc.mul_(mask)
        m = torch.bmm(kc.transpose(1, 2), vc).mul_(c)              # [G, d, dv], scaled by c
        del kc, vc
        # K and V themselves are saved, not their centred copies: they are views of the
        # projections' outputs, which the local residual's convolution saves anyway, so
        # centred copies would add 2 N x d per layer to training memory (~120 MiB for
        # InLine-PVT-T at 800x1344); the backward centres them again, one at a time
        if mask is None:
            ctx.save_for_backward(q, k, v, m, k_mean, v_mean)
            ctx.c, ctx.n = c, n
        else:
            ctx.save_for_backward(q, k, v, m, k_mean, v_mean, c, n)
        # the mean row is added in place: baddbmm would first copy it, broadcast, into
        # the output (a slower pass over N x dv than this add)
        return torch.bmm(q, m).add_(v_mean)                       # [G, Nq, dv]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k, v, m, k_mean, v_mean, *masked = ctx.saved_tensors
        # c and N: floats, or [G, 1, 1] tensors under a key mask (the gradients of the
        # masked rows are then zeroed by the mask's product outside)
        c, n = masked if masked else (ctx.c, ctx.n)
        grad_q = grad_k = grad_v = None
        if ctx.needs_input_grad[0]:
            grad_q = grad @ m.transpose(1, 2)                      # [G, Nq, d]
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            grad_m = q.transpose(1, 2) @ grad                      # [G, d, dv] (unscaled)
            if ctx.needs_input_grad[1]:
                # dK = c (V - 1 v_mean^T) dM^T, centred first (as in the forward)
                grad_k = torch.bmm(v - v_mean, grad_m.transpose(1, 2) * c)
            if ctx.needs_input_grad[2]:
                # dV = c (K - 1 k_mean^T) dM + 1 sum_i(grad_i)^T / N
                grad_v = torch.bmm(k - k_mean, grad_m * c).add_(grad.sum(dim=1, keepdim=True) / n)
        return grad_q, grad_k, grad_v, None, None


def inline_attention(q: torch.Tensor,
                     k: torch.Tensor,
                     v: torch.Tensor,
                     kernel: str = 'identity',
                     scale: Optional[float] = None,
                     real_keys: Optional[torch.Tensor] = None) -> torch.Tensor:
    """InLine attention of queries ``q`` over keys ``k`` and values ``v``.

    Args:
        q (Tensor): queries, [B, heads, Nq, d].
        k (Tensor): keys, [B, heads, N, d].
        v (Tensor): values, [B, heads, N, dv].
        kernel (str): feature map phi for q and k, one of 'identity', 'relu',
            'leakyrelu', 'exp'. Default: 'identity'.
        scale (float, optional): s in the definition; defaults to d ** -0.5.
        real_keys (Tensor, optional): which keys exist, [B, N] or [B, heads, N], true
            (or 1) for a real key; masked keys leave the means and ``K^T V``, and N
            becomes each group's number of real keys (at least one expected; a group
            without any gets ``0`` out). None (default): every key, the unmasked path.

    Returns:
        Tensor: [B, heads, Nq, dv] in the dtype of ``q``.
    """
    _check_qkv(q, k, v)
    phi = get_feature_map(kernel)
    out_dtype = q.dtype
    dtype = _compute_dtype(out_dtype)
    b, h, nq, _ = q.shape
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = (t.reshape(b * h, t.shape[2], t.shape[3])
                   for t in (phi(q.to(dtype)), phi(k.to(dtype)), v.to(dtype)))
        if real_keys is None:
            out = _CentredLinearAttention.apply(q, k, v, scale)
        else:
            mask = _real_keys_column(real_keys, k.view(b, h, k.shape[1], -1), dtype)
            out = _CentredLinearAttention.apply(q, k * mask, v * mask, scale, mask)
    return out.view(b, h, nq, v.shape[-1]).to(out_dtype)
