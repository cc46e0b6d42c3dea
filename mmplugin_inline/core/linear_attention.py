"""Fast plain (sum-normalised) linear attention with InLine's calling convention.

Takes q, k, v of [B, heads, N, d], a ``kernel`` name and an optional ``real_keys``, so
the layers, analyses and benchmarks can swap it with
:func:`~mmplugin_inline.core.inline_attention`.
"""
from typing import Optional

import torch

from .feature_maps import get_feature_map
from .inline_attention import _check_qkv, _compute_dtype, _real_keys_column


def linear_attention(q: torch.Tensor,
                     k: torch.Tensor,
                     v: torch.Tensor,
                     kernel: str = 'relu',
                     eps: float = 1e-6,
                     real_keys: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Plain (sum-normalised) linear attention in O(N d^2), [B, heads, Nq, dv].

    ``out_i = phi(q_i) (phi(K)^T V) / (phi(q_i) . sum_j phi(k_j) + eps)``, computed in
    fp32 (fp64 kept) with autocast off, returned in the dtype of ``q``. With
    ``real_keys`` ([B, N] or [B, heads, N], true for a real key) the masked keys leave
    both sums (their rows of phi(K) and V are zeroed after phi).
    """
    _check_qkv(q, k, v)
    phi = get_feature_map(kernel)
    out_dtype, dtype = q.dtype, _compute_dtype(q.dtype)
    b, h = k.shape[:2]
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = phi(q.to(dtype)), phi(k.to(dtype)), v.to(dtype)
        if real_keys is not None:
            mask = _real_keys_column(real_keys, k, dtype).view(b, h, -1, 1)
            k, v = k * mask, v * mask
        kv = k.transpose(-2, -1) @ v                            # [B, h, d, dv]
        denom = q @ k.sum(dim=2).unsqueeze(-1)                  # [B, h, Nq, 1]
        out = (q @ kv) / (denom + eps)
    return out.to(out_dtype)
