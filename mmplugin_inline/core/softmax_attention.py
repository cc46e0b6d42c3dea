"""Softmax attention with InLine's calling convention, through torch's SDPA.

Takes q, k, v of [B, heads, N, d] and a ``kernel`` name (ignored), so analyses and
benchmarks can swap it with :func:`~mmplugin_inline.core.inline_attention`.
"""
import torch.nn.functional as F

from .inline_attention import _check_qkv


def softmax_attention(q, k, v, kernel='identity', scale=None):
    """Softmax attention via ``F.scaled_dot_product_attention``; ``kernel`` is ignored."""
    _check_qkv(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, scale=scale)
