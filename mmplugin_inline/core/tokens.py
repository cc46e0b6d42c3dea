"""Token plumbing shared by the backbone families: layouts, padding, windows, stripes.

Conventions: maps are NCHW ``[B, C, H, W]`` or channels-last ``[B, H, W, C]``; token
sequences are NLC ``[B, H*W, C]`` in row-major (h, w) order.
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true


def nchw_to_nlc(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H*W, C]."""
    return x.flatten(2).transpose(1, 2)


def nlc_to_nchw(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """[B, H*W, C] -> [B, C, H, W] for ``hw = (H, W)``."""
    h, w = hw
    b, n, c = x.shape
    if n != h * w:
        raise ValueError(f'{n} tokens cannot form a {h}x{w} map')
    return x.transpose(1, 2).reshape(b, c, h, w)


def pad_amount(size: int, multiple: int) -> int:
    """How much to add to ``size`` to reach a multiple of ``multiple``.

    Plain integer arithmetic, so that it also holds for symbolic sizes (``torch.export``
    / ONNX export with dynamic H, W), where it stays an expression of the input size.
    Written as ``ceil(size / multiple) * multiple - size`` so that the padded size
    ``size + pad`` cancels to a multiple of a floor division, and a strided layer after it
    divides it exactly: the sizes of later stages stay short expressions of the input's
    (``(multiple - size % multiple) % multiple`` would nest a modulo per stage, and the
    exporter's simplification of those nested expressions is slow). The ceiling is
    ``(size + multiple - 1) // multiple``, with positive operands only: ONNX's integer
    ``Div`` truncates towards zero, so ``-(-size // multiple)`` exports as a floor
    (outputs one row short).
    """
    if known_zero(size % multiple):
        # a size that is a known multiple (concrete, or e.g. a map padded to whole stripes
        # of its own width) needs nothing: returning 0 keeps ``(2w - 1) // w``, which the
        # exporter cannot simplify to 1, out of every later size and guard
        return 0
    return (size + multiple - 1) // multiple * multiple - size


def known_equal(a, b) -> bool:
    """``a == b`` for concrete sizes; for symbolic sizes, only when it holds for every size.

    A size-dependent branch taken on this (e.g. "already the right size: skip") keeps
    the exported graph general: when the sizes are symbolic the general path is taken.
    """
    equal = a == b
    if isinstance(equal, torch.Tensor):
        # torch.jit tracing (the FLOP counter) hands sizes over as 0-d tensors: the trace
        # is taken at one size, so the concrete answer is the right one
        return bool(equal)
    return statically_known_true(equal)


def known_zero(*amounts) -> bool:
    """Whether every padding amount is known to be zero, so the pad can be skipped.

    On concrete sizes (eager) this is ``all(a == 0 ...)``. On symbolic sizes (export
    with dynamic H, W) an amount such as ``(4 - H % 4) % 4`` is zero for some sizes
    only: it is not known, so the caller pads (a zero pad is a plain copy) instead of
    branching on it, which would fix the exported graph to the example's sizes.
    """
    return all(known_equal(a, 0) for a in amounts)


def pad_to_multiple(x: torch.Tensor, multiple: Tuple[int, int], channels_last: bool = True,
                    value: float = 0.0) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """Zero-pad the bottom / right of a map so H and W are multiples of ``multiple``.

    Args:
        x (Tensor): [B, H, W, C] (``channels_last=True``) or [B, C, H, W].
        multiple (tuple[int, int]): (mh, mw).
        channels_last (bool): layout of ``x``. Default: True.
        value (float): padding value. Default: 0.

    Returns:
        tuple: the padded map and the original ``(H, W)``, for :func:`crop_to`.
    """
    h, w = (x.shape[1], x.shape[2]) if channels_last else (x.shape[2], x.shape[3])
    ph, pw = pad_amount(h, multiple[0]), pad_amount(w, multiple[1])
    if not known_zero(ph, pw):
        pad = (0, 0, 0, pw, 0, ph) if channels_last else (0, pw, 0, ph)
        x = F.pad(x, pad, value=value)
    return x, (h, w)


def crop_to(x: torch.Tensor, hw: Tuple[int, int], channels_last: bool = True) -> torch.Tensor:
    """Undo :func:`pad_to_multiple`: keep the top-left ``hw`` of the map."""
    h, w = hw
    return x[:, :h, :w] if channels_last else x[:, :, :h, :w]


def window_partition(x: torch.Tensor, window: Tuple[int, int]) -> torch.Tensor:
    """Split a channels-last map into non-overlapping windows.

    Args:
        x (Tensor): [B, H, W, C] with H, W multiples of the window.
        window (tuple[int, int]): (wh, ww).

    Returns:
        Tensor: [B * nWh * nWw, wh * ww, C], windows in row-major order per sample.
    """
    b, h, w, c = x.shape
    wh, ww = window
    if h % wh or w % ww:
        raise ValueError(f'a {h}x{w} map is not a whole number of {wh}x{ww} windows; '
                         'pad it with pad_to_multiple first')
    x = x.view(b, h // wh, wh, w // ww, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh * ww, c)


def window_reverse(windows: torch.Tensor, window: Tuple[int, int],
                   hw: Tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`window_partition`: [B*nW, wh*ww, C] -> [B, H, W, C]."""
    wh, ww = window
    h, w = hw
    c = windows.shape[-1]
    b = windows.shape[0] // ((h // wh) * (w // ww))
    x = windows.view(b, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def stripe_partition(x: torch.Tensor, width: int, vertical: bool) -> torch.Tensor:
    """CSWin stripes: vertical stripes are (H, width) windows, horizontal (width, W).

    Args:
        x (Tensor): [B, H, W, C]; W (vertical) or H (horizontal) a multiple of ``width``.
        width (int): stripe width.
        vertical (bool): vertical (full-height) or horizontal (full-width) stripes.

    Returns:
        Tensor: [B * n_stripes, stripe_tokens, C].
    """
    return window_partition(x, stripe_shape(x.shape[1:3], width, vertical))


def stripe_reverse(stripes: torch.Tensor, width: int, vertical: bool,
                   hw: Tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`stripe_partition`: -> [B, H, W, C]."""
    return window_reverse(stripes, stripe_shape(hw, width, vertical), hw)


def stripe_shape(hw, width: int, vertical: bool) -> Tuple[int, int]:
    """The window shape of one stripe of a map of size ``hw``.

    The sizes are used as they are (no ``int()``), so symbolic sizes stay symbolic.
    """
    return (hw[0], width) if vertical else (width, hw[1])
