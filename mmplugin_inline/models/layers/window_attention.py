"""Swin's attention in (shifted) windows, and the pieces only windows need.

The relative position index of a window, the additive mask of shifted windows, the
per-key mask of padded windows, :class:`WindowGrid` (a map cut into windows and pasted
back: CSWin's stripes use it too, a stripe is a window) and :class:`WindowAttention`.
"""
from collections import OrderedDict
from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn

from mmplugin_inline.core import (
    crop_to,
    fast_paths_enabled,
    pad_amount,
    pad_to_multiple,
    window_partition,
    window_reverse,
)
from mmplugin_inline.core.tokens import known_equal

from .attention import MultiHeadAttentionBase
from .linear import Linear
from .mixers import Group
from .padding import MASK_VALUE


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
    same size share one instead of each building its own (``ne``, ``bitwise_or``,
    ``fill_`` and partition copies). Built by ``build()`` every time instead: on the
    reference paths, and while sizes are not plain integers or a graph is being captured
    (``torch.export`` / ONNX with dynamic sizes, ``torch.compile``, jit tracing), where
    the mask must stay an expression of the input size in the graph.
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


def shifted_window_mask(hw: Tuple[int, int], real_hw: Tuple[int, int], window: Tuple[int, int],
                        shift: Tuple[int, int], device=None) -> Optional[torch.Tensor]:
    """Additive mask for (shifted) windows over a padded map, [nW, N, N], or None.

    Keys in another shift region than the query, and keys in the padding (outside
    ``real_hw``), get :data:`MASK_VALUE`. Built from the padded size, once per size
    (:func:`cached_mask`). The caller must not write into the result.
    """
    key = ('shift', *hw, *real_hw, *window, *shift, str(device))
    return cached_mask(key, lambda: _shifted_window_mask(hw, real_hw, window, shift, device))


def _shifted_window_mask(hw, real_hw, window, shift, device):
    (h, w), (vh, vw) = hw, real_hw
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


def padding_real_mask(hw: Tuple[int, int], real_hw: Tuple[int, int], window: Tuple[int, int],
                     batch: int, device=None, shift: Tuple[int, int] = (0, 0)
                     ) -> Optional[torch.Tensor]:
    """Which tokens of each window of a bottom / right padded map are real, or None.

    Returns a bool [batch * nW, wh * ww] (windows batch-major, as
    :func:`~mmplugin_inline.core.window_partition` orders them), or None when the map
    ``hw`` has no padding beyond ``real_hw``. With ``shift`` the map is rolled by
    ``-shift`` first (Swin's cyclic shift). Cached per size (:func:`cached_mask`); the
    caller must not write into the result.
    """
    key = ('pad', *hw, *real_hw, *window, batch, *shift, str(device))
    return cached_mask(key, lambda: _padding_real_mask(hw, real_hw, window, batch, device,
                                                      shift))


def _padding_real_mask(hw, real_hw, window, batch, device, shift=(0, 0)):
    (h, w), (vh, vw) = hw, real_hw
    if known_equal(vh, h) and known_equal(vw, w):
        return None
    real = (torch.arange(h, device=device) < vh)[:, None] \
        & (torch.arange(w, device=device) < vw)[None, :]                  # [H, W]
    return _window_keys(real[None], window, shift).repeat(batch, 1)


def _window_keys(real: torch.Tensor, window: Tuple[int, int], shift: Tuple[int, int]):
    """A bool map [B, H, W] (H, W whole windows) -> its windows' tokens, [B * nW, wh * ww]."""
    if any(shift):
        real = torch.roll(real, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    return window_partition(real.unsqueeze(-1), window).squeeze(-1)


class WindowGrid:
    """A channels-last map cut into (shifted) windows, and pasted back.

    The map ``hw`` is padded bottom / right to whole windows, rolled by ``-shift`` (Swin's
    cyclic shift) and cut row-major, windows batch-major: :meth:`cut` and :meth:`paste`.
    :attr:`real` says which tokens of each window are real: None when all are; else a
    bool [B * nW, wh * ww], false on the padding to whole windows and, given ``real``
    (bool [B, H, W], the pad-aware mode), on each image's padding in the canvas.

    Args:
        hw (tuple[int, int]): the map (H, W).
        window (tuple[int, int]): the window (wh, ww); a stripe is a window.
        batch (int): B.
        shift (tuple[int, int]): cyclic shift. Default: (0, 0).
        real (Tensor, optional): bool [B, H, W], true on real tokens.
        device: where masks are built.
    """

    def __init__(self, hw, window, batch, shift=(0, 0), real=None, device=None):
        self.hw, self.window, self.shift, self.batch = hw, window, shift, batch
        self.device = device
        self.padded = (hw[0] + pad_amount(hw[0], window[0]), hw[1] + pad_amount(hw[1], window[1]))
        if real is None:
            self.real = padding_real_mask(self.padded, hw, window, batch, device, shift)
        else:
            self.real = _window_keys(pad_to_multiple(real.unsqueeze(-1), window)[0]
                                     .squeeze(-1), window, shift)

    def cut(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, W, C] -> [B * nW, wh * ww, C] (padded with zeros, rolled, partitioned)."""
        x, _ = pad_to_multiple(x, self.window)
        if any(self.shift):
            x = torch.roll(x, shifts=(-self.shift[0], -self.shift[1]), dims=(1, 2))
        return window_partition(x, self.window)

    def paste(self, windows: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`cut`: [B * nW, wh * ww, C] -> [B, H, W, C] (a cropped view)."""
        x = window_reverse(windows, self.window, self.padded)
        if any(self.shift):
            x = torch.roll(x, shifts=self.shift, dims=(1, 2))
        return crop_to(x, self.hw)


class WindowAttention(MultiHeadAttentionBase):
    """Attention in (shifted) windows: Swin's W-MSA / SW-MSA, or a linear mixer in windows.

    Any H x W: the map is padded to whole windows and the output is cropped; the padded
    tokens are not real (the mixer's ``Group.real``), so a border window gives what its
    real tokens give alone. As in the authors' Swin, a map no larger than one window in
    its short side gets no shift.
    Shifted windows and the relative position bias are for mixers that take an additive
    bias (softmax): a shifted window mixes regions whose queries see different keys,
    which a per-key mask cannot express (``shift=True`` with 'I' or 'L' raises).

    Args:
        dim (int): width.
        num_heads (int): heads.
        attn_type (str | type): 'S' (softmax), 'I' or 'L' (see
            :class:`~.attention.MultiHeadAttentionBase`). Default: 'S'.
        qkv_bias (bool): bias in the ``qkv`` projection. Default: True.
        kernel (str, optional): feature map of the linear mixers. Default: None.
        window_size (int): window side. Default: 7.
        shift (bool): shift the windows by half a window (SW-MSA, softmax only).
            Default: False.
        rel_pos_bias (bool): learned relative position bias (softmax). Default: True
            for 'S', ignored otherwise.
        proj_drop (float): dropout after the output projection. Default: 0.
        local_residual (bool): linear mixers with their local residual. Default: True.
    """

    def __init__(self, dim, num_heads, attn_type='S', qkv_bias=True, kernel=None,
                 window_size=7, shift=False, rel_pos_bias=True, proj_drop=0.0,
                 local_residual=True):
        super().__init__(dim, num_heads, attn_type, kernel, local_residual)
        # created before the bias table (as GlobalAttention does): the seeded
        # initialisation and the parameter order (optimizer state) depend on it
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if window_size < 1:
            raise ValueError(f'window_size must be positive, got {window_size}')
        if shift and not self.mixer.takes_bias:
            raise ValueError(f"shifted windows are softmax only (attn_type='S'); "
                             f"{self.mixer.name} windows (attn_type={self.attn_type!r}) "
                             'take shift=False')
        self.window_size, self.shift = window_size, shift
        self.use_rel_pos = self.mixer.takes_bias and rel_pos_bias
        if self.use_rel_pos:
            self.relative_position_bias_table = nn.Parameter(
                torch.zeros((2 * window_size - 1) ** 2, num_heads))
            nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
            self.register_buffer('relative_position_index',
                                 relative_position_index((window_size,) * 2, (window_size,) * 2),
                                 persistent=False)

    def project(self, x: torch.Tensor):
        """q, k, v of the tokens ``x``, each [..., C]."""
        return self.qkv(x).chunk(3, dim=-1)

    def shift_for(self, hw: Tuple[int, int]) -> int:
        """The shift of a map of size ``hw``: half a window for SW-MSA, none for a map no
        larger than one window in its short side."""
        return self.window_size // 2 if self.shift and min(hw) > self.window_size else 0

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], real=None) -> torch.Tensor:
        """x: [B, H*W, C] -> [B, H*W, C].

        ``real`` (pad-aware mode, a :class:`~.padding.RealGrid`): each image's padded
        tokens are not real. The shift follows each image's own size (as it would alone);
        images that differ are attended in two groups. With its padded keys masked, a
        shifted image gives in a larger canvas what it gives alone: the windows are
        offset by the same shift from the top left, and the roll's wrap-around lands in
        masked padding or another region.
        """
        if real is None:
            return self._attend(x, hw, None, self.shift_for(hw))
        shifts = [self.shift_for(size) for size in real.sizes]
        mask = real.map_mask()
        if len(set(shifts)) == 1:
            return self._attend(x, hw, mask, shifts[0])
        out = torch.empty_like(x)
        for shift in sorted(set(shifts)):
            idx = torch.tensor([i for i, s in enumerate(shifts) if s == shift], device=x.device)
            out[idx] = self._attend(x[idx], hw, mask[idx], shift)
        return out

    def _attend(self, x, hw, real, shift: int) -> torch.Tensor:
        """The windows of ``x`` [B, H*W, C] with real tokens ``real`` (bool [B, H, W] or
        None: all real), shifted by ``shift``."""
        b, n, c = x.shape
        ws = self.window_size
        grid = WindowGrid(hw, (ws, ws), b, (shift, shift), real, x.device)
        windows = grid.cut(x.view(b, hw[0], hw[1], c))                # [B*nW, ws*ws, C]
        q, k, v = self.project(windows)
        out = self.mixer(q, k, v, Group((ws, ws), grid.real, self._bias(grid, ws * ws),
                                        mean_of=(windows, grid.real)))
        return self.proj_drop(self.proj(grid.paste(out).reshape(b, n, c)))

    def _bias(self, grid: WindowGrid, n: int) -> Optional[torch.Tensor]:
        """The additive bias of the windows: the learned relative position bias
        [heads, n, n] and, for shifted windows, the region mask (keys of another region
        than the query's are removed) per window, [B * nW, heads | 1, n, n]; or None."""
        bias = self._relative_position_bias(n) if self.use_rel_pos else None
        if any(grid.shift):
            region = shifted_window_mask(grid.padded, grid.padded, grid.window, grid.shift,
                                         grid.device).unsqueeze(1)            # [nW, 1, n, n]
            bias = region if bias is None else bias.unsqueeze(0) + region
            # windows are ordered batch-major: [B*nW, ...] -> per-window bias repeated over B
            # (not for a batch of one: the copy would be of the whole [nW, heads, n, n])
            if not known_equal(grid.batch, 1):
                bias = bias.repeat(grid.batch, 1, 1, 1)
        return bias

    def _relative_position_bias(self, n: int) -> torch.Tensor:
        """The learned relative position bias of an ``n``-token window: [heads, n, n]."""
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(n, n, -1).permute(2, 0, 1)
