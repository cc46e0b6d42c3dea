"""One stage of every backbone family, and the token bundle the stages pass along.

A backbone is a list of :class:`Stage` modules run by one loop
(:class:`~mmplugin_inline.models.backbones.InLineBackbone`): each stage's ``forward``
embeds its input (a downsampling layer: patch embedding, patch merging or a strided conv;
a cls token; a position embedding), runs its blocks and applies its output norm, so that hooks,
``checkpoint_wrapper``, FSDP wrapping and ``torch.compile`` of a stage cover all of it.
What passes from stage to stage is one :class:`TokenMap`: the tokens, the map they form
and, in pad-aware mode, the grid of real tokens.
"""
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .blocks import run_blocks
from .embed import resize_pos_embed
from .padding import RealGrid, place_pos_embed


class TokenMap(NamedTuple):
    """What passes from stage to stage: ``x``, the tokens [B, num_prefix + H*W, C] (before
    the first stage, the image batch [B, C, H, W]); ``hw``, the map (H, W) they form (the
    image size before the first stage); ``real``, in pad-aware mode each image's real part
    of the map (a :class:`~.padding.RealGrid`; None: every token is real); ``num_prefix``,
    the leading tokens that are not on the map (DeiT's cls token)."""
    x: torch.Tensor
    hw: Tuple[int, int]
    real: Optional[RealGrid] = None
    num_prefix: int = 0
    #: the stage's output tokens [B, H*W, C] (normed, prefix dropped, padding zero) when
    #: the stage emits one (:attr:`Stage.emits_output`), else None
    out: Optional[torch.Tensor] = None


class Stage(nn.Module):
    """Downsampling (or embedding), optional cls token and position embedding, blocks,
    optional output norm.

    Args:
        blocks (Sequence[nn.Module]): the blocks, called as ``block(x, hw, with_cp, real)``
            (:class:`~.blocks.TransformerBlock`).
        downsample (nn.Module, optional): called as ``downsample(x, hw)`` on the previous
            stage's tokens (or the image), returns ``(tokens, new hw)``; its ``stride`` says
            how the real-token grid shrinks (a token with one real pixel is real).
        dim (int): the stage's width (for the cls token and position embedding).
        pos_grid (tuple[int, int], optional): a learned position embedding for this grid
            (resized to the input's map, per image in pad-aware mode). Default: None.
        pos_mode (str): its interpolation. Default: 'bilinear'.
        cls_token (bool): prepend a learned cls token (a prefix token). Default: False.
        drop (float, optional): dropout after the embedding; None: no dropout module.
        norm (nn.Module, optional): the norm of the stage's output (``out_norm``).

    Set by the backbone that owns it (plain attributes, not arguments): ``with_cp`` (see
    :func:`~.blocks.run_blocks`), ``emits_output`` (compute :attr:`TokenMap.out`; default:
    whether the stage has a norm) and ``finite_check`` (None, or a callable
    ``(tokens, part)`` called with part 'embedded' after the embedding and 'done' after
    the blocks).
    """

    def __init__(self, blocks: Sequence[nn.Module], downsample: Optional[nn.Module] = None,
                 dim: int = 0, pos_grid: Optional[Tuple[int, int]] = None,
                 pos_mode: str = 'bilinear', cls_token: bool = False,
                 drop: Optional[float] = None, norm: Optional[nn.Module] = None):
        super().__init__()
        self.downsample = downsample
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cls_token else None
        self.pos_grid, self.pos_mode = pos_grid, pos_mode
        num_prefix = int(cls_token)
        self.pos_embed = None if pos_grid is None else nn.Parameter(
            torch.zeros(1, num_prefix + pos_grid[0] * pos_grid[1], dim))
        self.drop = None if drop is None else nn.Dropout(drop)
        self.blocks = nn.ModuleList(blocks)
        self.norm = norm
        self.with_cp = False
        self.emits_output = norm is not None
        self.finite_check = None

    def embed_modules(self) -> list:
        """What embeds the input: the downsampling, cls token and position embedding."""
        return [m for m in (self.downsample, self.cls_token, self.pos_embed) if m is not None]

    def embed(self, t: TokenMap) -> TokenMap:
        """The input (previous stage's tokens or the image) as this stage's tokens."""
        x, hw, real, p = t.x, t.hw, t.real, t.num_prefix
        if self.downsample is not None:
            x, hw = self.downsample(x, hw)
            if real is not None:
                real = real.down(self.downsample.stride, hw)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            p = 1
        if self.pos_embed is not None:
            if real is None:
                pos = resize_pos_embed(self.pos_embed, self.pos_grid, hw, num_prefix=p,
                                       mode=self.pos_mode)
            else:  # each image's own grid, placed into the canvas
                pos = place_pos_embed(self.pos_embed, self.pos_grid, real, resize_pos_embed,
                                      num_prefix=p, mode=self.pos_mode)
            x = x + pos
        if self.drop is not None:
            x = self.drop(x)
        return TokenMap(x, hw, real, p)

    def forward(self, t: TokenMap) -> TokenMap:
        """The whole stage: the embedding of ``t`` (the previous stage's tokens or the
        image), the blocks (padded tokens are zero after them) and, when the stage emits
        an output, its output tokens (:attr:`TokenMap.out`)."""
        t = self.embed(t)
        if self.finite_check is not None:
            self.finite_check(t.x, 'embedded')
        t = t._replace(x=run_blocks(self.blocks, t.x, t.hw, self.with_cp, t.real))
        if self.finite_check is not None:
            self.finite_check(t.x, 'done')
        return t._replace(out=self.output(t)) if self.emits_output else t

    def output(self, t: TokenMap) -> torch.Tensor:
        """The stage's output tokens [B, H*W, C]: normed, prefix dropped, padding zero."""
        x = t.x if self.norm is None else self.norm(t.x)
        if t.num_prefix:
            x = x[:, t.num_prefix:]
        return x if t.real is None else t.real.zero(x)
