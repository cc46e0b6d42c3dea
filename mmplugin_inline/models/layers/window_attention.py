"""Swin's attention in (shifted) windows, and the pieces only windows need.

The relative position index of a window, the additive mask of shifted / padded
windows (CSWin's padded stripes use it too: a stripe is a window), the per-key mask
of padded windows (InLine), and :class:`WindowAttention`.
"""
from collections import OrderedDict
from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn

from mmplugin_inline.core import (crop_to, fast_paths_enabled, pad_to_multiple, window_partition,
                                  window_reverse)
from mmplugin_inline.core.tokens import known_equal

from .attention import MultiHeadAttentionBase
from .linear import Linear

# additive bias that removes a key from softmax attention (Swin's value; finite, so a
# query that sees only masked keys stays finite; its output is cropped away)
MASK_VALUE = -100.0


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


#: masks built for recent (size, window, shift, device) keys; the oldest is dropped past
#: MASK_CACHE_SIZE (a detector sees a few sizes per stage, a test many)
_mask_cache: 'OrderedDict[tuple, Optional[torch.Tensor]]' = OrderedDict()
MASK_CACHE_SIZE = 64


def cached_mask(key: tuple, build: Callable[[], Optional[torch.Tensor]]):
    """``build()``, remembered under ``key`` (sizes, window, shift, device).

    The masks depend only on sizes, so every block of a stage and every forward at the
    same size share one (they were rebuilt per block and forward: ``ne``, ``bitwise_or``,
    ``fill_`` and partition copies, a few % of a CSWin forward). Not cached, so built as
    before: on the reference paths, and while sizes are not plain integers or a graph is
    being captured (``torch.export`` / ONNX with dynamic sizes, ``torch.compile``, jit
    tracing), where the mask must stay an expression of the input size in the graph.
    On CUDA the cached mask stays on its device; callers never write into it.
    """
    # a symbolic size (SymInt) or a 0-d tensor (jit tracing) is not a plain int: built
    if not fast_paths_enabled() or not all(type(k) in (int, str) for k in key) \
            or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return build()
    if key in _mask_cache:
        _mask_cache.move_to_end(key)
        return _mask_cache[key]
    # a mask made under inference_mode would be an inference tensor, which a later
    # training forward could not save for its backward
    with torch.inference_mode(False), torch.no_grad():
        mask = build()
    if mask is not None and type(mask) is not torch.Tensor:  # a fake / traced tensor
        return mask
    _mask_cache[key] = mask
    if len(_mask_cache) > MASK_CACHE_SIZE:
        _mask_cache.popitem(last=False)
    return mask


def shifted_window_mask(hw: Tuple[int, int], valid_hw: Tuple[int, int], window: Tuple[int, int],
                        shift: Tuple[int, int], device=None) -> Optional[torch.Tensor]:
    """Additive mask for (shifted) windows over a padded map, [nW, N, N], or None.

    Keys in another shift region than the query, and keys in the padding (outside
    ``valid_hw``), get :data:`MASK_VALUE`. Built from the padded size, once per size
    (:func:`cached_mask`). The caller must not write into the result.
    """
    key = ('shift', *hw, *valid_hw, *window, *shift, str(device))
    return cached_mask(key, lambda: _shifted_window_mask(hw, valid_hw, window, shift, device))


def _shifted_window_mask(hw, valid_hw, window, shift, device):
    (h, w), (vh, vw) = hw, valid_hw
    if not any(shift) and known_equal(vh, h) and known_equal(vw, w):
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


def padding_key_mask(hw: Tuple[int, int], valid_hw: Tuple[int, int], window: Tuple[int, int],
                     batch: int, device=None) -> Optional[torch.Tensor]:
    """Which tokens of each window of a bottom / right padded map are real, or None.

    Returns a bool [batch * nW, wh * ww] (windows batch-major, as
    :func:`~mmplugin_inline.core.window_partition` orders them), or None when the map
    ``hw`` has no padding beyond ``valid_hw``. Cached per size (:func:`cached_mask`);
    the caller must not write into the result.
    """
    key = ('pad', *hw, *valid_hw, *window, batch, str(device))
    return cached_mask(key, lambda: _padding_key_mask(hw, valid_hw, window, batch, device))


def _padding_key_mask(hw, valid_hw, window, batch, device):
    (h, w), (vh, vw) = hw, valid_hw
    if known_equal(vh, h) and known_equal(vw, w):
        return None
    valid = (torch.arange(h, device=device) < vh)[:, None] \
        & (torch.arange(w, device=device) < vw)[None, :]                  # [H, W]
    valid = window_partition(valid[None, :, :, None], window).squeeze(-1)  # [nW, N]
    return valid.repeat(batch, 1)


class WindowAttention(MultiHeadAttentionBase):
    """Attention in (shifted) windows: Swin's W-MSA / SW-MSA, or InLine in windows.

    Any H x W: the map is padded to whole windows, padded keys are masked and the
    output is cropped. For softmax an additive bias removes them; for InLine a per-key
    mask takes them out of the means, ``K^T V`` and the mean token, and zeroes their
    values in the local residual, so a border window gives what its real tokens give
    alone. As in the authors' Swin, a map no larger than one window in its short side
    gets no shift. InLine windows are never shifted (``shift=True`` with 'I' raises):
    a shifted window mixes regions whose queries see different keys, which a per-key
    mask cannot express.

    Args:
        dim (int): width.
        num_heads (int): heads.
        attn_type (str): 'S' (softmax) or 'I' (InLine in windows). Default: 'S'.
        qkv_bias (bool): bias in the ``qkv`` projection. Default: True.
        kernel (str): InLine feature map. Default: 'identity'.
        window_size (int): window side. Default: 7.
        shift (bool): shift the windows by half a window (SW-MSA, softmax only).
            Default: False.
        rel_pos_bias (bool): learned relative position bias (softmax). Default: True
            for 'S', ignored for 'I'.
        proj_drop (float): dropout after the output projection. Default: 0.
    """

    def __init__(self, dim, num_heads, attn_type='S', qkv_bias=True, kernel='identity',
                 window_size=7, shift=False, rel_pos_bias=True, proj_drop=0.0):
        super().__init__(dim, num_heads, attn_type, kernel)
        # created before the bias table (as GlobalAttention does): the seeded
        # initialisation and the parameter order (optimizer state) depend on it
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if window_size < 1:
            raise ValueError(f'window_size must be positive, got {window_size}')
        if shift and not self.kind.can_shift:
            raise ValueError("shifted windows are softmax only (attn_type='S'); InLine "
                             "windows (attn_type='I') take shift=False")
        self.window_size, self.shift = window_size, shift
        self.use_rel_pos = self.kind.relative_position_bias and rel_pos_bias
        if self.use_rel_pos:
            self.relative_position_bias_table = nn.Parameter(
                torch.zeros((2 * window_size - 1) ** 2, num_heads))
            nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
            self.register_buffer('relative_position_index',
                                 relative_position_index((window_size,) * 2, (window_size,) * 2),
                                 persistent=False)

    def project(self, x: torch.Tensor):
        """q, k, v of the window tokens ``x``, each [G, N, C]."""
        return self.qkv(x).chunk(3, dim=-1)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], valid=None) -> torch.Tensor:
        """x: [B, H*W, C] -> [B, H*W, C]; ``valid``: see :meth:`_forward_padded`."""
        if valid is not None:
            return self._forward_padded(x, hw, valid)
        if self.kind.reads_mean_token and fast_paths_enabled():
            return self._inline_windows(x, hw)
        b, n, c = x.shape
        h, w = hw
        ws = self.window_size
        shift = ws // 2 if self.shift and min(h, w) > ws else 0
        xm, _ = pad_to_multiple(x.view(b, h, w, c), (ws, ws))
        hp, wp = xm.shape[1:3]
        if shift:
            xm = torch.roll(xm, shifts=(-shift, -shift), dims=(1, 2))
        windows = window_partition(xm, (ws, ws))                      # [B*nW, ws*ws, C]
        q, k, v = self.project(windows)
        if self.kind.reads_mean_token:  # InLine: padded keys masked out of its statistics
            valid = padding_key_mask((hp, wp), (h, w), (ws, ws), b, x.device)
            if valid is None:
                mean_token = windows.mean(dim=1)
            else:  # the padded tokens of x are zeros: sum over the window / real count
                mean_token = windows.sum(dim=1) / valid.sum(dim=1, keepdim=True).to(x.dtype)
            out = self.attend(q, k, v, (ws, ws), mean_token=mean_token, key_mask=valid)
        else:  # softmax: padded keys (and the shift's wrapped regions) masked by a bias
            bias = shifted_window_mask((hp, wp), (h, w), (ws, ws), (shift, shift), x.device)
            out = self._softmax_windows(q, k, v, bias, b)
        out = window_reverse(out, (ws, ws), (hp, wp))
        if shift:
            out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
        out = crop_to(out, hw).reshape(b, n, c)
        return self.proj_drop(self.proj(out))

    def _inline_windows(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """InLine in windows, projecting the real tokens only and padding after.

        The reference (:meth:`forward` on the reference paths) pads ``x`` first, so the
        projection ran on tokens that are masked and cropped away (a 128 map in 14
        windows is padded to 140: 20% more tokens). Here q, k, v of the padding are
        zeros: the padded keys are masked out of every statistic either way, padded
        values are zero for the local residual either way, and the padded queries'
        outputs are cropped, so the result is the same.
        """
        b, n, c = x.shape
        h, w = hw
        ws = self.window_size
        qkv, _ = pad_to_multiple(self.qkv(x).view(b, h, w, 3 * c), (ws, ws))
        hp, wp = qkv.shape[1:3]
        q, k, v = window_partition(qkv, (ws, ws)).chunk(3, dim=-1)      # [B*nW, ws*ws, C]
        valid = padding_key_mask((hp, wp), (h, w), (ws, ws), b, x.device)
        # the mean token of each window's real tokens: window sums of the zero-padded
        # map over the count of real tokens (no window copy of x is made)
        xm, _ = pad_to_multiple(x.view(b, h, w, c), (ws, ws))
        sums = xm.view(b, hp // ws, ws, wp // ws, ws, c).sum(dim=(2, 4)).reshape(-1, c)
        count = ws * ws if valid is None else valid.sum(dim=1, keepdim=True).to(x.dtype)
        out = self.attend(q, k, v, (ws, ws), mean_token=sums / count, key_mask=valid)
        out = crop_to(window_reverse(out, (ws, ws), (hp, wp)), hw).reshape(b, n, c)
        return self.proj_drop(self.proj(out))

    def _forward_padded(self, x: torch.Tensor, hw: Tuple[int, int], valid) -> torch.Tensor:
        """Pad-aware windows: each image's padded tokens are masked per image.

        The shift follows each image's own size (an image no larger than one window in
        its short side gets none, as it would alone); images that differ are attended in
        two groups. With its padded keys masked, a shifted image gives in a larger canvas
        what it gives alone: the windows are offset by the same shift from the top left,
        and the roll's wrap-around lands in masked padding or another region.
        """
        ws = self.window_size
        shifts = [ws // 2 if self.shift and min(s) > ws else 0 for s in valid.sizes]
        if len(set(shifts)) == 1:
            return self._padded_windows(x, hw, valid.map_mask(), shifts[0])
        out = torch.empty_like(x)
        mask = valid.map_mask()
        for shift in sorted(set(shifts)):
            idx = torch.tensor([i for i, s in enumerate(shifts) if s == shift], device=x.device)
            out[idx] = self._padded_windows(x[idx], hw, mask[idx], shift)
        return out

    def _padded_windows(self, x, hw, mask, shift: int) -> torch.Tensor:
        """Windows over the canvas with the per-image token mask ``mask`` [B, H, W]."""
        b, n, c = x.shape
        ws = self.window_size
        xm, _ = pad_to_multiple(x.view(b, *hw, c), (ws, ws))
        real, _ = pad_to_multiple(mask.unsqueeze(-1).to(x.dtype), (ws, ws))
        hp, wp = xm.shape[1:3]
        if shift:
            xm, real = (torch.roll(t, shifts=(-shift, -shift), dims=(1, 2)) for t in (xm, real))
        windows = window_partition(xm, (ws, ws))                      # [B*nW, ws*ws, C]
        keys = window_partition(real, (ws, ws)).squeeze(-1) > 0       # [B*nW, ws*ws]
        q, k, v = self.project(windows)
        if self.kind.reads_mean_token:  # InLine: the real tokens' statistics per window
            count = keys.sum(dim=1, keepdim=True).clamp_min(1).to(x.dtype)
            mean_token = torch.where(keys.unsqueeze(-1), windows, 0.0).sum(dim=1) / count
            out = self.attend(q, k, v, (ws, ws), mean_token=mean_token, key_mask=keys)
        else:  # softmax: the shift's region mask and each image's padded keys
            region = shifted_window_mask((hp, wp), (hp, wp), (ws, ws), (shift, shift), x.device)
            nw = keys.shape[0] // b
            removed = ~keys.view(b, nw, 1, -1)
            if region is not None:
                removed = removed | (region != 0).unsqueeze(0)
            bias = torch.zeros(removed.shape, dtype=q.dtype, device=x.device)
            bias = bias.masked_fill_(removed, MASK_VALUE).flatten(0, 1).unsqueeze(1)
            if self.use_rel_pos:
                bias = bias + self._relative_position_bias(ws * ws).to(q.dtype)
            out = self.attend(q, k, v, bias=bias)
        out = window_reverse(out, (ws, ws), (hp, wp))
        if shift:
            out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
        out = crop_to(out, hw).reshape(b, n, c)
        return self.proj_drop(self.proj(out))

    def _relative_position_bias(self, n: int) -> torch.Tensor:
        """The learned relative position bias of an ``n``-token window: [heads, n, n]."""
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(n, n, -1).permute(2, 0, 1)

    def _softmax_windows(self, q, k, v, mask, batch):
        """Softmax per window with relative position bias and the window mask."""
        bias = None
        if self.use_rel_pos:
            bias = self._relative_position_bias(q.shape[1])                  # [heads, N, N]
        if mask is not None:
            mask = mask.unsqueeze(1)                                         # [nW, 1, N, N]
            bias = mask if bias is None else bias.unsqueeze(0) + mask
            # windows are ordered batch-major: [B*nW, ...] -> per-window bias repeated over B
            # (not for a batch of one: the copy would be of the whole [nW, heads, N, N])
            if not (known_equal(batch, 1) and fast_paths_enabled()):
                bias = bias.repeat(batch, 1, 1, 1)
        return self.attend(q, k, v, bias=bias)
