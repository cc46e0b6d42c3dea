"""The fast InLine attention kernel: O(N d^2) time, O(N d) memory, never an N x N tensor.

For one head with N tokens, width d and s = d^-0.5 (see ``core/README.md``)::

    out_i = mean(V) + (s / N) * phi(q_i) @ M,   M = (phi(K) - mean phi(K))^T V   [d, d]

and because the centred keys sum to zero, M = phi(K)^T V - N mean(phi(K)) mean(V)^T:
one N-long matmul and two column means, then a d x d correction. All of it runs in
fp32 (fp64 stays fp64) with autocast off; the result comes back in the input dtype.
"""
from typing import Optional

import torch

from .kernels import get_kernel


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


def inline_attention(q: torch.Tensor,
                     k: torch.Tensor,
                     v: torch.Tensor,
                     kernel: str = 'identity',
                     scale: Optional[float] = None) -> torch.Tensor:
    """InLine attention of queries ``q`` over keys ``k`` and values ``v``.

    Args:
        q (Tensor): queries, [B, heads, Nq, d].
        k (Tensor): keys, [B, heads, N, d].
        v (Tensor): values, [B, heads, N, dv].
        kernel (str): feature map phi for q and k, one of 'identity', 'relu',
            'leakyrelu', 'exp'. Default: 'identity'.
        scale (float, optional): s in the definition; defaults to d ** -0.5.

    Returns:
        Tensor: [B, heads, Nq, dv] in the dtype of ``q``.
    """
    _check_qkv(q, k, v)
    phi = get_kernel(kernel)
    out_dtype = q.dtype
    dtype = _compute_dtype(out_dtype)
    n = k.shape[2]
    if scale is None:
        scale = q.shape[-1] ** -0.5
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = phi(q.to(dtype)), phi(k.to(dtype)), v.to(dtype)
        k_mean = k.mean(dim=2, keepdim=True)                   # [B, h, 1, d]
        v_mean = v.mean(dim=2, keepdim=True)                   # [B, h, 1, dv]
        kv = k.transpose(-2, -1) @ v                           # [B, h, d, dv]
        # centre: (K - 1 k_mean^T)^T V = K^T V - N k_mean^T v_mean (exact, d x d only)
        kv = (kv - n * k_mean.transpose(-2, -1) @ v_mean) * (scale / n)
        out = torch.baddbmm(v_mean.flatten(0, 1), q.flatten(0, 1), kv.flatten(0, 1))
    return out.view(*q.shape[:3], v.shape[-1]).to(out_dtype)
