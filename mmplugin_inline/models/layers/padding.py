"""Padding-aware mode: which tokens of a padded batch are real, stage by stage.

mmdet pads every image of a batch to the largest one (then to ``pad_size_divisor``);
mmseg pads an image smaller than the crop to the preprocessor's ``size``. With
``pad_aware=True`` a backbone keeps those padded tokens out of everything a real token
sees, so an image gives the same features alone and inside any padded batch
(``docs/padding_aware.md``). The bookkeeping lives here:

- :class:`RealGrid`: the valid size of each image on one token map (a canvas of
  ``hw``), its token mask, and the grid of the next, strided stage (a token is real
  when its patch holds at least one real pixel: ``ceil(size / stride)``);
- :func:`real_grid_of`: the per-image valid sizes a backbone's input carries
  (explicit ``real_hw``, or the attribute :data:`REAL_HW_ATTR` that the plugin's
  data preprocessors set on the batch tensor);
- :func:`key_bias`: the additive softmax bias that removes padded keys;
- :func:`place_pos_embed`: a position embedding resized to each image's own grid and
  placed into the canvas.

The grid is passed explicitly down the call chain (``run_blocks`` -> block ->
attention), never through a global: gradient checkpointing recomputes blocks in the
backward pass, outside any context the forward set.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

#: the attribute of a batch tensor that carries its images' valid sizes ([B, 2] LongTensor,
#: (h, w) in pixels); set by :mod:`mmplugin_inline.openmmlab.data_preprocessors`
REAL_HW_ATTR = 'inline_real_hw'

#: the one additive bias that removes a key from softmax attention: padded keys and the
#: shifted windows' cross-region pairs (Swin's value; finite, so a query whose keys are all
#: removed, a window in the padding, stays finite; its output is cropped away)
MASK_VALUE = -100.0


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class RealGrid:
    """The real part of each image on one token map of a padded batch.

    Args:
        sizes (Sequence[tuple[int, int]]): per image, its valid (h, w) on this map.
        hw (tuple[int, int]): the canvas (H, W) of the map.
        device: where the masks are built.
    """

    def __init__(self, sizes: Sequence[Tuple[int, int]], hw: Tuple[int, int], device=None):
        self.sizes = [(min(int(h), hw[0]), min(int(w), hw[1])) for h, w in sizes]
        self.hw = (int(hw[0]), int(hw[1]))
        self.device = device
        self._mask = None

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def full(self) -> bool:
        """Every image fills the canvas (nothing to mask)."""
        return all(s == self.hw for s in self.sizes)

    def down(self, stride: int, hw: Tuple[int, int]) -> 'RealGrid':
        """The grid of the next map, strided by ``stride`` (ceil: a token with one real
        pixel is real), on the canvas ``hw``."""
        return RealGrid([(_ceil_div(h, stride), _ceil_div(w, stride)) for h, w in self.sizes],
                         hw, self.device)

    def map_mask(self) -> torch.Tensor:
        """bool [B, H, W]: true on real tokens."""
        if self._mask is None:
            h, w = self.hw
            sizes = torch.tensor(self.sizes, device=self.device, dtype=torch.long).view(-1, 2)
            rows = torch.arange(h, device=self.device).view(1, h, 1) < sizes[:, 0].view(-1, 1, 1)
            cols = torch.arange(w, device=self.device).view(1, 1, w) < sizes[:, 1].view(-1, 1, 1)
            self._mask = rows & cols
        return self._mask

    def token_mask(self, num_prefix: int = 0) -> torch.Tensor:
        """bool [B, num_prefix + H*W]: true on real tokens (prefix tokens are real)."""
        mask = self.map_mask().flatten(1)
        if num_prefix:
            mask = torch.cat([mask.new_ones(mask.shape[0], num_prefix), mask], dim=1)
        return mask

    def zero(self, x: torch.Tensor, num_prefix: int = 0) -> torch.Tensor:
        """Tokens [B, num_prefix + H*W, C] with the padded ones set to zero (a where, not a
        product: a non-finite padded value is removed too)."""
        mask = self.token_mask(num_prefix).unsqueeze(-1)
        return torch.where(mask, x, x.new_zeros(()))

    def zero_map(self, x: torch.Tensor) -> torch.Tensor:
        """An NCHW map [B, C, H, W] with the padded positions set to zero."""
        return torch.where(self.map_mask().unsqueeze(1), x, x.new_zeros(()))


def as_size_list(real_hw, batch: int) -> List[Tuple[int, int]]:
    """``real_hw`` (a [B, 2] tensor or a sequence of (h, w)) as a list of int pairs."""
    if isinstance(real_hw, torch.Tensor):
        real_hw = real_hw.detach().cpu().view(-1, 2).tolist()
    sizes = [(int(h), int(w)) for h, w in real_hw]
    if len(sizes) != batch:
        raise ValueError(f'real_hw gives {len(sizes)} sizes for a batch of {batch} images')
    if any(h < 1 or w < 1 for h, w in sizes):
        raise ValueError(f'real_hw must be positive (h, w) pairs, got {sizes}')
    return sizes


def real_grid_of(x: torch.Tensor, real_hw=None) -> Optional[RealGrid]:
    """The pixel :class:`RealGrid` of a backbone input, or None when nothing is padded.

    ``real_hw`` (explicit) wins; else the attribute :data:`REAL_HW_ATTR` of ``x`` (set by
    the plugin's data preprocessors); else None. None too when every image fills the
    batch canvas: the backbone then runs its default path.
    """
    if real_hw is None:
        real_hw = getattr(x, REAL_HW_ATTR, None)
        if real_hw is None:
            return None
    grid = RealGrid(as_size_list(real_hw, x.shape[0]), tuple(x.shape[-2:]), x.device)
    return None if grid.full else grid


def key_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive softmax bias [G, 1, 1, N] from a key mask [G, N] (true = real key):
    0 on real keys, :data:`MASK_VALUE` on the others."""
    # (m - 1) * 100 is 0 or -100 exactly; written with arithmetic, not a masked fill, so
    # that the FLOP counter sees element-wise ops it knows
    return ((mask.to(dtype) - 1) * -MASK_VALUE)[:, None, None, :]


def place_pos_embed(pos_embed: torch.Tensor, src_hw: Tuple[int, int], grid: RealGrid,
                    resize, num_prefix: int = 0, mode: str = 'bilinear') -> torch.Tensor:
    """A position embedding [1, num_prefix + h*w, C] per image, [B, num_prefix + H*W, C].

    Each image's grid part is ``resize(pos_embed, src_hw, its valid size, num_prefix,
    mode)`` (as the image alone would get it), placed at the top left of the canvas,
    zeros elsewhere; the prefix part is the same for every image.
    """
    h, w = grid.hw
    c = pos_embed.shape[-1]
    resized = {}
    maps = []
    for size in grid.sizes:
        if size not in resized:
            pe = resize(pos_embed, src_hw, size, num_prefix=num_prefix, mode=mode)
            part = pe[:, num_prefix:].reshape(1, size[0], size[1], c)
            resized[size] = F.pad(part, (0, 0, 0, w - size[1], 0, h - size[0]))
        maps.append(resized[size])
    out = torch.cat(maps).reshape(len(maps), h * w, c)
    if num_prefix:
        out = torch.cat([pos_embed[:, :num_prefix].expand(len(maps), -1, -1), out], dim=1)
    return out
