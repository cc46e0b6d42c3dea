"""The shared attention base of the InLine backbones, and global attention.

:class:`MultiHeadAttentionBase` owns what every variant shares: head splitting and
the dispatch, by block-type letter (:data:`ATTN_TYPES`), between InLine attention
(``'I'``, with its local residual) and softmax attention (``'S'``, through SDPA).
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
import torch.nn.functional as F

from mmplugin_inline.core import (fast_paths_enabled, get_feature_map, inline_attention,
                                  local_residual, local_residual_nhwc, nchw_to_nlc, nlc_to_nchw,
                                  pad_to_multiple)

#: block-type letter -> the attention it selects (``block_types`` strings, ``attn_type``)
ATTN_TYPES = {'I': 'InLine', 'S': 'softmax'}


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, N, C] -> [B, heads, N, C // heads]."""
    b, n, c = x.shape
    return x.view(b, n, num_heads, c // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, N, d] -> [B, N, heads * d]."""
    b, h, n, d = x.shape
    x = x.transpose(1, 2)
    if torch.compiler.is_exporting():
        # SDPA's traced output strides are [B, N, heads, d] memory (the CPU kernel's), so
        # the graph records this as a view; the ONNX exporter then decomposes SDPA into
        # ops with [B, heads, N, d] memory, where that view fails (InLine-Swin-T's
        # softmax windows). An explicit copy in exported graphs only: eager keeps the
        # free view when the memory allows it
        x = x.clone(memory_format=torch.contiguous_format)
    return x.reshape(b, n, h * d)


def describe_attn_types(conjunction: str = 'or', extra=()) -> str:
    """The letters of :data:`ATTN_TYPES` for messages: ``"'I' (InLine) or 'S' (softmax)"``.

    ``extra`` descriptions are appended; the last item is joined by ``conjunction``.
    """
    items = [f'{letter!r} ({name})' for letter, name in ATTN_TYPES.items()] + list(extra)
    return f' {conjunction} '.join([', '.join(items[:-1]), items[-1]]) if len(items) > 1 \
        else items[0]


def check_attn_type(attn_type: str) -> None:
    """Raise a clear error for a letter that is not in :data:`ATTN_TYPES`."""
    if attn_type not in ATTN_TYPES:
        raise ValueError(f'attn_type must be {describe_attn_types()}, got {attn_type!r}')


def check_heads(dim: int, num_heads: int) -> None:
    """Raise a clear error when ``num_heads`` does not divide ``dim``."""
    if num_heads < 1 or dim % num_heads:
        divisors = [n for n in range(1, dim + 1) if dim % n == 0]
        raise ValueError(f'num_heads={num_heads} must divide the width {dim} (each head '
                         f'gets width / num_heads channels): set num_heads in the arch to one '
                         f'of {divisors}, or change the width')


def grouped_pointwise(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """``conv`` (a grouped ``Conv1d`` of kernel size 1) on one token per sample: [B, Cin] -> [B, Cout].

    The same product as ``conv(x.unsqueeze(-1)).squeeze(-1)``, as one batched matrix
    product over the groups: a convolution call on a length-1 sequence costs more in
    set-up (oneDNN on the CPU, cuDNN on the GPU) than its few multiply-adds.
    """
    g = conv.groups
    cin, cout = conv.in_channels // g, conv.out_channels // g
    w = conv.weight.view(g, cout, cin).transpose(1, 2)                  # [g, Cin/g, Cout/g]
    xg = x.view(x.shape[0], g, cin).transpose(0, 1)                    # [g, B, Cin/g]
    y = torch.bmm(xg, w) if conv.bias is None else \
        torch.baddbmm(conv.bias.view(g, 1, cout), xg, w)               # [g, B, Cout/g]
    return y.transpose(0, 1).reshape(x.shape[0], g * cout)


class ResidualKernelPredictor(nn.Sequential):
    """Predicts the per-sample 3x3 depthwise kernels of the local residual.

    ``Conv1d(C, C, 1, groups=heads) -> GELU -> Conv1d(C, 9C, 1, groups=heads)`` on the
    mean token; output [B, C, 3, 3]. The modules are the authors' (their checkpoints
    load as they are); :meth:`forward` runs them as grouped matrix products
    (:func:`grouped_pointwise`), :meth:`forward_reference` as the convolutions.
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__(
            nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads), nn.GELU(),
            nn.Conv1d(dim, dim * 9, kernel_size=1, groups=num_heads))

    def forward(self, mean_token: torch.Tensor) -> torch.Tensor:  # [B, C] -> [B, C, 3, 3]
        if not fast_paths_enabled():
            return self.forward_reference(mean_token)
        b, c = mean_token.shape
        hidden = self[1](grouped_pointwise(mean_token, self[0]))
        return grouped_pointwise(hidden, self[2]).view(b, c, 3, 3)

    def forward_reference(self, mean_token: torch.Tensor) -> torch.Tensor:
        """The same kernels through the ``Conv1d`` modules (the check of :meth:`forward`)."""
        b, c = mean_token.shape
        return super().forward(mean_token.unsqueeze(-1)).view(b, c, 3, 3)


class MultiHeadAttentionBase(nn.Module):
    """Multi-head attention over already projected tokens: InLine (+ local residual) or softmax.

    Subclasses project the tokens, group them (map, windows, stripes) and call
    :meth:`attend` on each group.

    Args:
        dim (int): width of q, k, v.
        num_heads (int): number of heads.
        attn_type (str): 'I' (InLine) or 'S' (softmax). Default: 'I'.
        kernel (str): InLine feature map. Default: 'identity'.
    """

    def __init__(self, dim: int, num_heads: int, attn_type: str = 'I', kernel: str = 'identity'):
        super().__init__()
        check_attn_type(attn_type)
        check_heads(dim, num_heads)
        get_feature_map(kernel)  # an unknown kernel name fails here, when the model is built
        self.dim, self.num_heads, self.attn_type, self.kernel = dim, num_heads, attn_type, kernel
        if attn_type == 'I':
            self.residual = ResidualKernelPredictor(dim, num_heads)

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
                border). ``mean_token`` must then be the mean of the real tokens. No
                prefix tokens with a mask.

        Returns:
            Tensor: [G, N, C].
        """
        h = self.num_heads
        if self.attn_type == 'S':
            if bias is not None:
                bias = bias.to(q.dtype)
            out = F.scaled_dot_product_attention(split_heads(q, h), split_heads(k, h),
                                                 split_heads(v, h), attn_mask=bias)
            return merge_heads(out)
        out = merge_heads(inline_attention(split_heads(q, h), split_heads(k, h), split_heads(v, h),
                                           kernel=self.kernel, key_mask=key_mask))
        weights = self.residual(mean_token)                          # [G, C, 3, 3]
        g, _, c = v.shape
        v = v[:, num_prefix:]
        if key_mask is not None:
            v = v * key_mask.unsqueeze(-1).to(v.dtype)               # padded V -> 0
        if not fast_paths_enabled():  # the NCHW grouped convolution, then a concatenation
            res = nchw_to_nlc(local_residual(nlc_to_nchw(v, hw), weights))
            if num_prefix:
                return torch.cat([out[:, :num_prefix], out[:, num_prefix:] + res], dim=1)
            return out + res
        # tokens are a channels-last map already: no transpose to NCHW and back
        res = local_residual_nhwc(v.reshape(g, hw[0], hw[1], c), weights)
        # added in place into the attention output (a fresh tensor): no third N x C
        # tensor, and the prefix rows (cls) are left as they are
        out[:, num_prefix:].view(g, hw[0], hw[1], c).add_(res)
        return out


class GlobalAttention(MultiHeadAttentionBase):
    """Attention over the whole map (PVT, DeiT, Swin's InLine blocks).

    Args:
        dim (int): width.
        num_heads (int): heads.
        attn_type (str): 'I' or 'S'. Default: 'I'.
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
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        else:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        if sr_ratio > 1:
            if attn_type != 'S' or num_prefix:
                raise ValueError('spatial reduction (sr_ratio > 1) applies to softmax attention '
                                 "on maps without prefix tokens (attn_type='S')")
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def project(self, x: torch.Tensor, kv_source: Optional[torch.Tensor] = None):
        """q from ``x``, k and v from ``kv_source`` (default ``x``); each [B, N, C]."""
        kv_source = x if kv_source is None else kv_source
        if self.separate_q:
            return (self.q(x), *self.kv(kv_source).chunk(2, dim=-1))
        return self.qkv(x).chunk(3, dim=-1)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """x: [B, num_prefix + H*W, C] (normed tokens), hw = (H, W) -> [B, N, C]."""
        kv_source = x
        if self.sr_ratio > 1:
            # pad to whole reduction cells so maps of any size (even smaller) reduce
            x_map, _ = pad_to_multiple(nlc_to_nchw(x, hw), (self.sr_ratio,) * 2,
                                       channels_last=False)
            reduced = self.sr(x_map)
            kv_source = self.norm(nchw_to_nlc(reduced))
        q, k, v = self.project(x, kv_source)
        out = self.attend(q, k, v, hw, mean_token=x.mean(dim=1) if self.attn_type == 'I' else None,
                          num_prefix=self.num_prefix)
        return self.proj_drop(self.proj(out))
