"""The shared attention base of the InLine backbones, and global attention.

:class:`MultiHeadAttentionBase` owns what every variant shares: head splitting and
the dispatch to its attention kind (InLine with its local residual, or softmax
through SDPA: :mod:`.attention_kinds`, read from the block letter once, at build).
Its subclasses differ only in how they group tokens: the whole map
(:class:`GlobalAttention`, here), windows (``window_attention.py``, Swin) or
cross-shaped stripes (``stripe_attention.py``, CSWin).

Parameter names follow the authors' released checkpoints (``qkv`` or ``q`` / ``kv``,
``proj``, ``residual``, ``relative_position_bias_table``, ``get_v``, ``sr``) so that
their weights load with few renames.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from mmplugin_inline.core import get_feature_map, nchw_to_nlc, nlc_to_nchw, pad_to_multiple

from .attention_kinds import (ATTN_KINDS, ATTN_TYPES, AttentionKind, ResidualKernelPredictor,
                              attention_kind, describe_attn_types, grouped_pointwise,
                              merge_heads, split_heads)
from .linear import Linear
from .padding import key_bias

__all__ = ['ATTN_KINDS', 'ATTN_TYPES', 'AttentionKind', 'ResidualKernelPredictor',
           'attention_kind', 'describe_attn_types', 'grouped_pointwise', 'merge_heads',
           'split_heads', 'check_heads', 'MultiHeadAttentionBase', 'GlobalAttention']


def check_heads(dim: int, num_heads: int) -> None:
    """Raise a clear error when ``num_heads`` does not divide ``dim``."""
    if num_heads < 1 or dim % num_heads:
        divisors = [n for n in range(1, dim + 1) if dim % n == 0]
        raise ValueError(f'num_heads={num_heads} must divide the width {dim} (each head '
                         f'gets width / num_heads channels): set num_heads in the arch to one '
                         f'of {divisors}, or change the width')


class MultiHeadAttentionBase(nn.Module):
    """Multi-head attention over already projected tokens: InLine (+ local residual) or softmax.

    Subclasses project the tokens, group them (map, windows, stripes) and call
    :meth:`attend` on each group.

    Args:
        dim (int): width of q, k, v.
        num_heads (int): number of heads.
        attn_type (str | AttentionKind): 'I' (InLine) or 'S' (softmax), read once into
            :attr:`kind`. Default: 'I'.
        kernel (str): InLine feature map. Default: 'identity'.
    """

    def __init__(self, dim: int, num_heads: int, attn_type='I', kernel: str = 'identity'):
        super().__init__()
        kind = attention_kind(attn_type)
        check_heads(dim, num_heads)
        get_feature_map(kernel)  # an unknown kernel name fails here, when the model is built
        self.dim, self.num_heads, self.kind, self.kernel = dim, num_heads, kind, kernel
        kind.build(self)

    @property
    def attn_type(self) -> str:
        """The block letter of :attr:`kind` ('I' or 'S')."""
        return self.kind.letter

    def extra_repr(self) -> str:
        return f'dim={self.dim}, num_heads={self.num_heads}, kind={self.kind!r}'

    def attend(self, q, k, v, hw: Optional[Tuple[int, int]] = None, mean_token=None,
               num_prefix: int = 0, bias=None, key_mask=None):
        """Attend within each group of tokens.

        Args:
            q, k, v (Tensor): [G, N, C] (G groups: batch x windows); k and v may have
                another length for softmax attention.
            hw (tuple[int, int]): the map the last ``N - num_prefix`` value tokens form
                (InLine local residual). Required for 'I'.
            mean_token (Tensor): [G, C], input of the residual kernel predictor ('I').
            num_prefix (int): leading tokens (cls) left out of the local residual.
            bias (Tensor, optional): additive softmax bias broadcastable to [G, heads, N, N].
            key_mask (Tensor, optional): [G, N], true for real tokens (InLine in padded
                windows): padded keys leave the InLine means and ``K^T V``, and their
                values are zeroed for the local residual (zero padding at the real
                border). ``mean_token`` must then be the mean of the real tokens. With
                prefix tokens the mask covers them too ([G, num_prefix + N]; they are
                real).

        Returns:
            Tensor: [G, N, C].
        """
        return self.kind.attend(self, q, k, v, hw, mean_token, num_prefix, bias, key_mask)


class GlobalAttention(MultiHeadAttentionBase):
    """Attention over the whole map (PVT, DeiT, Swin's InLine blocks).

    Args:
        dim (int): width.
        num_heads (int): heads.
        attn_type (str | AttentionKind): 'I' or 'S'. Default: 'I'.
        qkv_bias (bool): bias in the input projections. Default: True.
        kernel (str): InLine feature map. Default: 'identity'.
        separate_q (bool): ``q`` and ``kv`` projections (PVT) instead of one ``qkv``.
        sr_ratio (int): spatial reduction of keys / values for softmax attention
            (PVT's SRA): a strided conv then LayerNorm. Default: 1 (none).
        num_prefix (int): leading non-spatial tokens (DeiT's cls token). Default: 0.
        proj_drop (float): dropout after the output projection. Default: 0.
    """

    def __init__(self, dim, num_heads, attn_type='I', qkv_bias=True, kernel='identity',
                 separate_q=False, sr_ratio=1, num_prefix=0, proj_drop=0.0):
        super().__init__(dim, num_heads, attn_type, kernel)
        self.separate_q, self.num_prefix, self.sr_ratio = separate_q, num_prefix, sr_ratio
        if separate_q:
            self.q = Linear(dim, dim, bias=qkv_bias)
            self.kv = Linear(dim, dim * 2, bias=qkv_bias)
        else:
            self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        if sr_ratio > 1:
            if self.kind.linear_in_tokens or num_prefix:
                raise ValueError('spatial reduction (sr_ratio > 1) applies to softmax attention '
                                 "on maps without prefix tokens (attn_type='S')")
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def project(self, x: torch.Tensor, kv_source: Optional[torch.Tensor] = None):
        """q from ``x``, k and v from ``kv_source`` (default ``x``); each [B, N, C]."""
        kv_source = x if kv_source is None else kv_source
        if self.separate_q:
            return (self.q(x), *self.kv(kv_source).chunk(2, dim=-1))
        return self.qkv(x).chunk(3, dim=-1)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], valid=None) -> torch.Tensor:
        """x: [B, num_prefix + H*W, C] (normed tokens), hw = (H, W) -> [B, N, C].

        ``valid`` (a :class:`~.padding.ValidGrid`, pad-aware mode): the padded tokens of
        each image are kept out of every statistic (:meth:`_forward_padded`).
        """
        if valid is not None:
            return self._forward_padded(x, hw, valid)
        kv_source = x
        if self.sr_ratio > 1:
            # pad to whole reduction cells so maps of any size (even smaller) reduce
            x_map, _ = pad_to_multiple(nlc_to_nchw(x, hw), (self.sr_ratio,) * 2,
                                       channels_last=False)
            reduced = self.sr(x_map)
            kv_source = self.norm(nchw_to_nlc(reduced))
        q, k, v = self.project(x, kv_source)
        out = self.attend(q, k, v, hw, mean_token=x.mean(dim=1) if self.kind.reads_mean_token else None,
                          num_prefix=self.num_prefix)
        return self.proj_drop(self.proj(out))

    def _forward_padded(self, x: torch.Tensor, hw: Tuple[int, int], valid) -> torch.Tensor:
        """:meth:`forward` with each image's padded tokens masked out (pad-aware mode).

        InLine: the padded keys leave the means, ``K^T V`` and N, the mean token is the
        mean of the real tokens (prefix tokens count) and padded values are zero for the
        local residual. Softmax: padded keys get a removing bias; with spatial reduction
        the padded tokens are zeroed before the strided conv, so a reduced token sees
        what the image alone gives it, and reduced tokens without a real one are masked.
        """
        p = self.num_prefix
        kv_source, keys = x, valid.token_mask(p)
        if self.sr_ratio > 1:
            x_map, _ = pad_to_multiple(nlc_to_nchw(valid.zero(x), hw), (self.sr_ratio,) * 2,
                                       channels_last=False)
            reduced = self.sr(x_map)
            kv_source = self.norm(nchw_to_nlc(reduced))
            keys = valid.down(self.sr_ratio, reduced.shape[2:]).token_mask()
        q, k, v = self.project(x, kv_source)
        if self.kind.reads_mean_token:
            out = self.attend(q, k, v, hw, mean_token=valid.mean(x, p), num_prefix=p,
                              key_mask=keys)
        else:
            out = self.attend(q, k, v, hw, num_prefix=p, bias=key_bias(keys, q.dtype))
        return self.proj_drop(self.proj(out))
