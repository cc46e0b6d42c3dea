"""Patch embedding and merging layers, padding inside so any input size works."""
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmplugin_inline.core import nchw_to_nlc, nlc_to_nchw, pad_amount
from mmplugin_inline.core.tokens import known_equal, known_zero

from .factories import build_norm
from .linear import Linear


class PatchEmbed(nn.Module):
    """Non-overlapping patches: ``Conv2d(k = stride = patch)`` then an optional norm.

    The input is zero-padded at the bottom / right to a multiple of the patch size, so
    no pixel is dropped: output size is ``ceil(H / patch) x ceil(W / patch)``.

    Takes an NCHW map, or tokens [B, H*W, C] with their ``hw`` (a previous stage's);
    returns ``(tokens [B, N, C], (H', W'))``.
    """

    def __init__(self, in_channels: int, embed_dim: int, patch_size: int, norm_cfg=None):
        super().__init__()
        self.in_channels, self.patch_size = in_channels, patch_size
        self.proj = nn.Conv2d(in_channels, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = build_norm(norm_cfg, embed_dim) if norm_cfg else None

    @property
    def stride(self) -> int:
        """How much smaller the output map is (a :class:`~.stage.Stage`'s downsampling)."""
        return self.patch_size

    def forward(self, x: torch.Tensor, hw=None) -> Tuple[torch.Tensor, Tuple[int, int]]:
        if x.dim() == 3 and hw is not None:
            x = nlc_to_nchw(x, hw)
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'expected an input of shape [B, {self.in_channels}, H, W], got '
                             f'{tuple(x.shape)}')
        p = self.patch_size
        ph, pw = pad_amount(x.shape[2], p), pad_amount(x.shape[3], p)
        if not known_zero(ph, pw):
            x = F.pad(x, (0, pw, 0, ph))
        x = self.proj(x)
        hw = (x.shape[2], x.shape[3])
        x = nchw_to_nlc(x)
        if self.norm is not None:
            x = self.norm(x)
        return x, hw


class PatchMerging(nn.Module):
    """Swin patch merging: 2x2 neighbours concatenated in the order (0,0), (1,0), (0,1),
    (1,1), then ``norm(4C)`` and ``Linear(4C, 2C, bias=False)``. Odd sizes are padded."""
    stride = 2

    def __init__(self, dim: int, norm_cfg=dict(type='LN')):
        super().__init__()
        self.norm = build_norm(norm_cfg, 4 * dim)
        self.reduction = Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]):
        b, n, c = x.shape
        h, w = hw
        x = x.view(b, h, w, c)
        ph, pw = pad_amount(h, 2), pad_amount(w, 2)  # exportable sizes (core.pad_amount)
        if not known_zero(ph, pw):
            x = F.pad(x, (0, 0, 0, pw, 0, ph))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        new_hw = (x.shape[1], x.shape[2])
        return self.reduction(self.norm(x.reshape(b, -1, 4 * c))), new_hw


class ConvMerging(nn.Module):
    """CSWin merging: ``Conv2d(3x3, stride 2, pad 1)`` then a norm; any size."""
    stride = 2

    def __init__(self, dim: int, out_dim: int, norm_cfg=dict(type='LN')):
        super().__init__()
        self.conv = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = build_norm(norm_cfg, out_dim)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]):
        b, n, c = x.shape
        x = self.conv(x.transpose(1, 2).reshape(b, c, *hw))
        new_hw = (x.shape[2], x.shape[3])
        return self.norm(nchw_to_nlc(x)), new_hw


def resize_pos_embed(pos_embed: torch.Tensor, src_hw: Tuple[int, int], dst_hw: Tuple[int, int],
                     num_prefix: int = 0, mode: str = 'bilinear') -> torch.Tensor:
    """Resize a learned position embedding [1, num_prefix + h*w, C] to another grid.

    Prefix tokens (cls) are kept as they are; the grid part is interpolated with
    ``align_corners=False`` (what the authors' PVT does at other input sizes).
    """
    if all(known_equal(s, d) for s, d in zip(src_hw, dst_hw)):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    c = grid.shape[-1]
    grid = grid.reshape(1, src_hw[0], src_hw[1], c).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(dst_hw), mode=mode, align_corners=False)
    return torch.cat([prefix, grid.flatten(2).transpose(1, 2)], dim=1)


def contiguous_map(x):
    """An output map in plain NCHW memory layout.

    ``nlc_to_nchw`` is a view with channels-last strides, and convolutions keep that
    layout, so the FPN's outputs would be channels-last too. mmcv's RoIAlign (CPU and
    CUDA) reads its input as contiguous NCHW whatever the strides, so on such maps it
    pools the wrong values: Mask R-CNN's box and mask heads then cannot learn while
    the RPN (plain convolutions) does. Every output of this package's backbones and
    necks goes through here.
    """
    return x.contiguous()
