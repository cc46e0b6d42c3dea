"""Explicit N x N forms: the definitions the fast kernels are checked against.

These build the full attention matrix and are meant for tests, analysis and pictures
on small inputs, never for models. ``inline_attention_authors`` transcribes the
formula of the authors' released code (their pre-scaling included) for benchmarks
and numerical comparisons.
"""
from typing import Callable, Dict, Optional

import torch

from .feature_maps import get_feature_map


def _scale(q: torch.Tensor, scale: Optional[float]) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def inline_attention_weights(q: torch.Tensor,
                             k: torch.Tensor,
                             kernel: str = 'identity',
                             scale: Optional[float] = None,
                             real_keys: Optional[torch.Tensor] = None) -> torch.Tensor:
    """InLine attention weights, exactly as defined.

    ``w_ij = 1/N + (s/N) * phi(q_i) . (phi(k_j) - mean_j phi(k_j))``; every row sums to 1.
    With ``real_keys``, the definition over the real keys only: N is their number, the
    mean runs over them, and a masked key's weight is 0.

    Args:
        q (Tensor): [B, heads, Nq, d].
        k (Tensor): [B, heads, N, d].
        kernel (str): feature map phi. Default: 'identity'.
        scale (float, optional): s, default d ** -0.5.
        real_keys (Tensor, optional): [B, N] or [B, heads, N], true for a real key.

    Returns:
        Tensor: [B, heads, Nq, N].
    """
    phi = get_feature_map(kernel)
    q, k = phi(q), phi(k)
    s = _scale(q, scale)
    if real_keys is None:
        n = k.shape[-2]
        k_centred = k - k.mean(dim=-2, keepdim=True)
        return 1.0 / n + (s / n) * (q @ k_centred.transpose(-2, -1))
    real = real_keys.to(q.dtype)
    real = (real.unsqueeze(1) if real.dim() == 2 else real).unsqueeze(-1)      # [B, h, N, 1]
    n = real.sum(dim=-2, keepdim=True)                                          # [B, h, 1, 1]
    k_mean = (k * real).sum(dim=-2, keepdim=True) / n
    w = 1.0 / n + (s / n) * (q @ (k - k_mean).transpose(-2, -1))
    return w * real.transpose(-2, -1)


def inline_attention_reference(q, k, v, kernel='identity', scale=None, real_keys=None):
    """InLine attention through the explicit weights: ``W @ V``, [B, heads, Nq, dv]."""
    return inline_attention_weights(q, k, kernel, scale, real_keys) @ v


def _real_keys_row(real_keys, q):
    """``real_keys`` ([B, N] or [B, heads, N]) as a 0 / 1 row [B, heads | 1, 1, N]."""
    real = real_keys.to(q.dtype)
    return (real.unsqueeze(1) if real.dim() == 2 else real).unsqueeze(-2)


def linear_attention_weights(q, k, kernel='relu', eps=1e-6, real_keys=None):
    """Plain linear attention weights ``phi(q_i).phi(k_j) / (sum_j phi(q_i).phi(k_j) + eps)``.

    Not injective: scaling q (or, under softmax-like feature maps, other changes) leaves
    the rows unchanged. ``eps`` guards the sum. With ``real_keys`` ([B, N] or
    [B, heads, N], true for a real key) a masked key's score is 0, so it leaves the sum.
    """
    phi = get_feature_map(kernel)
    scores = phi(q) @ phi(k).transpose(-2, -1)
    if real_keys is not None:
        scores = scores * _real_keys_row(real_keys, q)
    return scores / (scores.sum(dim=-1, keepdim=True) + eps)


def linear_attention_reference(q, k, v, kernel='relu', eps=1e-6, real_keys=None):
    """Plain linear attention through its explicit weights, [B, heads, Nq, dv]."""
    return linear_attention_weights(q, k, kernel, eps, real_keys) @ v


def softmax_attention_weights(q, k, kernel='identity', scale=None, real_keys=None, bias=None):
    """Softmax attention weights ``softmax(s q k^T + bias)``; ``kernel`` is ignored.

    ``real_keys`` ([B, N] or [B, heads, N], true for a real key): a masked key's weight
    is exactly 0 (the definition over the valid keys). ``bias``: an additive score bias
    broadcastable to [B, heads, Nq, N].
    """
    scores = (q @ k.transpose(-2, -1)) * _scale(q, scale)
    if bias is not None:
        scores = scores + bias
    if real_keys is not None:
        scores = scores.masked_fill(_real_keys_row(real_keys, q) == 0, float('-inf'))
    return torch.softmax(scores, dim=-1)


def softmax_attention_reference(q, k, v, kernel='identity', scale=None, real_keys=None,
                                bias=None):
    """Softmax attention with the N x N matrix materialised, [B, heads, Nq, dv]."""
    return softmax_attention_weights(q, k, kernel, scale, real_keys, bias) @ v


def inline_attention_authors(q, k, v, kernel='identity', scale=None):
    """The authors' released formulation, transcribed with every intermediate.

    ``q @ ((k^T sqrt(s/N)) @ (v sqrt(s/N))) + (1 - q @ mean_k^T * s) * mean_v`` with
    phi applied to q and k first. Same value as the definition in exact arithmetic,
    but it subtracts two large terms, so it loses accuracy in low precision.
    """
    phi = get_feature_map(kernel)
    q, k = phi(q), phi(k)
    n = k.shape[-2]
    s = _scale(q, scale)
    kv = (k.transpose(-2, -1) * (s / n) ** 0.5) @ (v * (s / n) ** 0.5)
    return q @ kv + (1 - q @ k.mean(dim=2, keepdim=True).transpose(-2, -1) * s) \
        * v.mean(dim=2, keepdim=True)


#: variant name -> its explicit N x N weights, called as ``(q, k, kernel=...)``
ATTENTION_WEIGHTS: Dict[str, Callable[..., torch.Tensor]] = {
    'inline': inline_attention_weights,
    'linear': linear_attention_weights,
    'softmax': softmax_attention_weights,
}
