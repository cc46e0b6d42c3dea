"""Fast plain (sum-normalised) linear attention with InLine's calling convention.

Takes q, k, v of [B, heads, N, d] and a ``kernel`` name, so analyses and benchmarks
can swap it with :func:`~mmplugin_inline.core.inline_attention`.
"""
import torch

from .feature_maps import get_feature_map
from .inline_attention import _check_qkv, _compute_dtype


def linear_attention(q, k, v, kernel='identity', eps=1e-6):
    """Plain (sum-normalised) linear attention in O(N d^2), [B, heads, Nq, dv].

    ``out_i = phi(q_i) (phi(K)^T V) / (phi(q_i) . sum_j phi(k_j) + eps)``, computed in
    fp32 (fp64 kept) with autocast off, returned in the dtype of ``q``.
    """
    _check_qkv(q, k, v)
    phi = get_feature_map(kernel)
    out_dtype, dtype = q.dtype, _compute_dtype(q.dtype)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = phi(q.to(dtype)), phi(k.to(dtype)), v.to(dtype)
        kv = k.transpose(-2, -1) @ v                            # [B, h, d, dv]
        denom = q @ k.sum(dim=2).unsqueeze(-1)                  # [B, h, Nq, 1]
        out = (q @ kv) / (denom + eps)
    return out.to(out_dtype)

