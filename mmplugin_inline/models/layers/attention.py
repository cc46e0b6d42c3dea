"""Attention modules of the InLine backbones.

One base class owns what every family shares: the input projections, the output
projection, head splitting, the dispatch between InLine attention (``'I'``, with its
local residual) and softmax attention (``'S'``, through SDPA). The subclasses differ
only in how they group tokens: the whole map (:class:`GlobalAttention`), windows
(:class:`WindowAttention`) or cross-shaped stripes (:class:`CSWinAttention`).

Parameter names follow the authors' released checkpoints (``qkv`` or ``q`` / ``kv``,
``proj``, ``residual``, ``relative_position_bias_table``, ``get_v``, ``sr``) so that
their weights load with few renames.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmplugin_inline.core import (crop_to, inline_attention, local_residual, nchw_to_nlc,
                                  nlc_to_nchw, pad_to_multiple, window_partition,
                                  window_reverse)

ATTN_TYPES = ('I', 'S')
# additive bias that removes a key from softmax attention (Swin's value; finite, so a
# query that sees only masked keys stays finite; its output is cropped away)
MASK_VALUE = -100.0


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, N, C] -> [B, heads, N, C // heads]."""
    b, n, c = x.shape
    return x.view(b, n, num_heads, c // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, N, d] -> [B, N, heads * d]."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def check_heads(dim: int, num_heads: int) -> None:
    """Raise a clear error when ``num_heads`` does not divide ``dim``."""
    if num_heads < 1 or dim % num_heads:
        raise ValueError(f'num_heads={num_heads} must divide the width {dim}')


class ResidualKernelPredictor(nn.Sequential):
    """Predicts the per-sample 3x3 depthwise kernels of the local residual.

    ``Conv1d(C, C, 1, groups=heads) -> GELU -> Conv1d(C, 9C, 1, groups=heads)`` on the
    mean token; output [B, C, 3, 3].
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__(
            nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads), nn.GELU(),
            nn.Conv1d(dim, dim * 9, kernel_size=1, groups=num_heads))

    def forward(self, mean_token: torch.Tensor) -> torch.Tensor:  # [B, C] -> [B, C, 3, 3]
        b, c = mean_token.shape
        return super().forward(mean_token.unsqueeze(-1)).view(b, c, 3, 3)


class HeadMixer(nn.Module):
    """Attention over already projected tokens: InLine (+ local residual) or softmax.

    Args:
        dim (int): width of q, k, v.
        num_heads (int): number of heads.
        attn_type (str): 'I' (InLine) or 'S' (softmax). Default: 'I'.
        kernel (str): InLine feature map. Default: 'identity'.
    """

    def __init__(self, dim: int, num_heads: int, attn_type: str = 'I', kernel: str = 'identity'):
        super().__init__()
        if attn_type not in ATTN_TYPES:
            raise ValueError(f"attn_type must be 'I' (InLine) or 'S' (softmax), got {attn_type!r}")
        check_heads(dim, num_heads)
        self.dim, self.num_heads, self.attn_type, self.kernel = dim, num_heads, attn_type, kernel
        if attn_type == 'I':
            self.residual = ResidualKernelPredictor(dim, num_heads)

    def attend(self, q, k, v, hw: Optional[Tuple[int, int]] = None, mean_token=None,
               num_prefix: int = 0, bias=None):
        """Attend within each group of tokens.

        Args:
            q, k, v (Tensor): [G, N, C] (G groups: batch x windows); k and v may have
                another length for softmax attention.
            hw (tuple[int, int]): the map the last ``N - num_prefix`` value tokens form
                (InLine local residual). Required for 'I'.
            mean_token (Tensor): [G, C], input of the residual kernel predictor ('I').
            num_prefix (int): leading tokens (cls) left out of the local residual.
            bias (Tensor, optional): additive softmax bias broadcastable to [G, heads, N, N].

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
                                           kernel=self.kernel))
        weights = self.residual(mean_token)                          # [G, C, 3, 3]
        res = nchw_to_nlc(local_residual(nlc_to_nchw(v[:, num_prefix:], hw), weights))
        if num_prefix:
            return torch.cat([out[:, :num_prefix], out[:, num_prefix:] + res], dim=1)
        return out + res


class GlobalAttention(HeadMixer):
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

    def project(self, x: torch.Tensor, kv_source: torch.Tensor):
        """q from ``x``, k and v from ``kv_source``; each [B, N, C]."""
        if self.separate_q:
            return (self.q(x), *self.kv(kv_source).chunk(2, dim=-1))
        return self.qkv(x).chunk(3, dim=-1)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], shortcut=None) -> torch.Tensor:
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


def relative_position_index(window: Tuple[int, int], table_window: Tuple[int, int]) -> torch.Tensor:
    """Index into a ``(2*Th-1)*(2*Tw-1)`` relative position table, [wh*ww, wh*ww].

    ``window`` may be smaller than the ``table_window`` the table was built for.
    """
    coords = torch.stack(torch.meshgrid(torch.arange(window[0]), torch.arange(window[1]),
                                        indexing='ij')).flatten(1)          # [2, N]
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)        # [N, N, 2]
    rel[..., 0] += table_window[0] - 1
    rel[..., 1] += table_window[1] - 1
    return rel[..., 0] * (2 * table_window[1] - 1) + rel[..., 1]


def shifted_window_mask(hw: Tuple[int, int], valid_hw: Tuple[int, int], window: Tuple[int, int],
                        shift: Tuple[int, int], device=None) -> Optional[torch.Tensor]:
    """Additive mask for (shifted) windows over a padded map, [nW, N, N], or None.

    Keys in another shift region than the query, and keys in the padding (outside
    ``valid_hw``), get :data:`MASK_VALUE`. Built from the padded size at each forward.
    """
    (h, w), (vh, vw) = hw, valid_hw
    if not any(shift) and (vh, vw) == (h, w):
        return None
    region = torch.zeros(1, h, w, 1, device=device)
    if any(shift):
        cnt = 0
        for hs in (slice(0, -window[0]), slice(-window[0], -shift[0]), slice(-shift[0], None)):
            for ws in (slice(0, -window[1]), slice(-window[1], -shift[1]), slice(-shift[1], None)):
                region[:, hs, ws] = cnt
                cnt += 1
    pad = torch.zeros(1, h, w, 1, device=device)
    pad[:, vh:] = 1
    pad[:, :, vw:] = 1
    if any(shift):
        pad = torch.roll(pad, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    region_w = window_partition(region, window).squeeze(-1)                 # [nW, N]
    pad_w = window_partition(pad, window).squeeze(-1)
    differ = (region_w[:, None, :] != region_w[:, :, None]) | (pad_w[:, None, :] > 0)
    return differ.float() * MASK_VALUE


class WindowAttention(GlobalAttention):
    """Attention in (shifted) windows: Swin's W-MSA / SW-MSA, or InLine in windows.

    Any H x W: the map is padded to whole windows, padded keys are masked (softmax)
    and the output is cropped. As in the authors' Swin, a map no larger than one
    window in its short side gets no shift.

    Args:
        dim, num_heads, attn_type, qkv_bias, kernel, proj_drop: as :class:`GlobalAttention`.
        window_size (int): window side. Default: 7.
        shift (bool): shift the windows by half a window (SW-MSA). Default: False.
        rel_pos_bias (bool): learned relative position bias (softmax). Default: True
            for 'S', ignored for 'I'.
    """

    def __init__(self, dim, num_heads, attn_type='S', qkv_bias=True, kernel='identity',
                 window_size=7, shift=False, rel_pos_bias=True, proj_drop=0.0):
        super().__init__(dim, num_heads, attn_type, qkv_bias, kernel, proj_drop=proj_drop)
        if window_size < 1:
            raise ValueError(f'window_size must be positive, got {window_size}')
        self.window_size, self.shift = window_size, shift
        self.use_rel_pos = attn_type == 'S' and rel_pos_bias
        if self.use_rel_pos:
            self.relative_position_bias_table = nn.Parameter(
                torch.zeros((2 * window_size - 1) ** 2, num_heads))
            nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
            self.register_buffer('relative_position_index',
                                 relative_position_index((window_size,) * 2, (window_size,) * 2),
                                 persistent=False)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], shortcut=None) -> torch.Tensor:
        """x: [B, H*W, C] -> [B, H*W, C]."""
        b, n, c = x.shape
        h, w = hw
        ws = self.window_size
        shift = ws // 2 if self.shift and min(h, w) > ws else 0
        xm, _ = pad_to_multiple(x.view(b, h, w, c), (ws, ws))
        hp, wp = xm.shape[1:3]
        if shift:
            xm = torch.roll(xm, shifts=(-shift, -shift), dims=(1, 2))
        windows = window_partition(xm, (ws, ws))                      # [B*nW, ws*ws, C]
        q, k, v = self.project(windows, windows)
        if self.attn_type == 'S':
            bias = shifted_window_mask((hp, wp), (h, w), (ws, ws), (shift, shift), x.device)
            out = self._softmax_windows(q, k, v, bias, b)
        else:
            out = self.attend(q, k, v, (ws, ws), mean_token=windows.mean(dim=1))
        out = window_reverse(out, (ws, ws), (hp, wp))
        if shift:
            out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
        out = crop_to(out, hw).reshape(b, n, c)
        return self.proj_drop(self.proj(out))

    def _softmax_windows(self, q, k, v, mask, batch):
        """Softmax per window with relative position bias and the window mask."""
        bias = None
        if self.use_rel_pos:
            bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
            bias = bias.view(q.shape[1], q.shape[1], -1).permute(2, 0, 1)   # [heads, N, N]
        if mask is not None:
            mask = mask.unsqueeze(1)                                         # [nW, 1, N, N]
            bias = mask if bias is None else bias.unsqueeze(0) + mask
            # windows are ordered batch-major: [B*nW, ...] -> per-window bias repeated over B
            bias = bias.repeat(batch, 1, 1, 1)
        return self.attend(q, k, v, bias=bias)


class CSWinBranch(HeadMixer):
    """One branch of CSWin attention: stripes (or the whole map) plus LePE.

    ``stripe`` is ``None`` for the whole map, else ``(width, vertical)``.
    """

    def __init__(self, dim, num_heads, attn_type, kernel='identity', stripe=None):
        super().__init__(dim, num_heads, attn_type, kernel)
        self.stripe = stripe
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)

    def forward(self, q, k, v, hw, mean_token):
        """q, k, v: [B, H*W, C] of this branch's channels -> [B, H*W, C]."""
        b, n, c = q.shape
        h, w = hw
        if self.stripe is None:
            win, maps = (h, w), [t.view(b, h, w, c) for t in (q, k, v)]
            hp, wp, bias = h, w, None
        else:
            width, vertical = self.stripe
            multiple = (1, width) if vertical else (width, 1)
            maps = [pad_to_multiple(t.view(b, h, w, c), multiple)[0] for t in (q, k, v)]
            hp, wp = maps[0].shape[1:3]
            win = (hp, width) if vertical else (width, wp)
            bias = shifted_window_mask((hp, wp), (h, w), win, (0, 0), q.device)
            if bias is not None:
                bias = bias.unsqueeze(1).repeat(b, 1, 1, 1)
        qw, kw, vw = (window_partition(t, win) for t in maps)          # [G, Nw, C]
        # LePE: depthwise conv of V inside each stripe (zero padded at stripe borders)
        v_img = nlc_to_nchw(vw, win)
        lepe = nchw_to_nlc(self.get_v(v_img))
        if self.attn_type == 'I':
            out = self.attend(qw, kw, vw, win, mean_token=mean_token)
        else:
            out = self.attend(qw, kw, vw, bias=bias)
        out = window_reverse(out + lepe, win, (hp, wp))
        return crop_to(out, hw).reshape(b, n, c)


class CSWinAttention(nn.Module):
    """CSWin attention: ``qkv``, two half-width stripe branches (or one full branch), ``proj``.

    InLine blocks use one branch over the whole map (the authors' setting, where the
    InLine split size equals the map size); softmax blocks use vertical and horizontal
    stripes of ``split_size`` in two half-channel branches, or one whole-map branch in
    the last stage. The residual kernel predictor reads the mean of the block input
    (before the norm), as in the authors' code: pass it as ``shortcut``.
    """

    def __init__(self, dim, num_heads, attn_type='I', split_size=7, last_stage=False,
                 qkv_bias=True, kernel='identity', proj_drop=0.0):
        super().__init__()
        if attn_type not in ATTN_TYPES:
            raise ValueError(f"attn_type must be 'I' (InLine) or 'S' (softmax), got {attn_type!r}")
        check_heads(dim, num_heads)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        one_branch = attn_type == 'I' or last_stage
        if one_branch:
            self.attns = nn.ModuleList([CSWinBranch(dim, num_heads, attn_type, kernel, None)])
        else:
            if dim % 2 or num_heads % 2:
                raise ValueError(f'two-branch CSWin attention needs an even width and head '
                                 f'count, got dim={dim}, num_heads={num_heads}')
            self.attns = nn.ModuleList([
                CSWinBranch(dim // 2, num_heads // 2, attn_type, kernel, (split_size, vertical))
                for vertical in (True, False)])
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, hw, shortcut=None):
        """x: normed [B, H*W, C]; shortcut: the block input (for the mean token)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        mean = (shortcut if shortcut is not None else x).mean(dim=1)
        parts = len(self.attns)
        split = [t.chunk(parts, dim=-1) for t in (q, k, v, mean)]
        out = torch.cat([branch(split[0][i], split[1][i], split[2][i], hw, split[3][i])
                         for i, branch in enumerate(self.attns)], dim=-1)
        return self.proj_drop(self.proj(out))
