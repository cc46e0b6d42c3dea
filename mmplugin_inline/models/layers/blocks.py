"""The transformer block shared by every family; the attention module is an argument."""
from typing import Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmcv.cnn.bricks.drop import DropPath

from .attention import ATTN_TYPES, describe_attn_types


class Mlp(nn.Module):
    """``fc1 -> act -> drop -> fc2 -> drop`` (the authors' names, so weights load as they are)."""

    def __init__(self, dim: int, hidden_dim: int, act_cfg=dict(type='GELU'), drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + DP(attn(LN(x)))`` then ``x + DP(MLP(LN(x)))``.

    Args:
        dim (int): width.
        attn (nn.Module): the token mixer, called as ``attn(normed, hw)`` and returning
            [B, N, C]; one whose ``reads_block_input`` is true (CSWin) is called as
            ``attn(normed, hw, shortcut=x)`` with the block input ``x``. Families pass
            their own (global, windows, stripes).
        mlp_ratio (float): hidden width of the MLP over ``dim``. Default: 4.
        drop_path (float): stochastic depth rate. Default: 0.
        drop (float): dropout in the MLP. Default: 0.
        norm_cfg (dict): norm layers. Default: ``dict(type='LN', eps=1e-6)``.
        act_cfg (dict): MLP activation. Default: ``dict(type='GELU')``.
    """

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float = 4.0, drop_path: float = 0.0,
                 drop: float = 0.0, norm_cfg=dict(type='LN', eps=1e-6), act_cfg=dict(type='GELU')):
        super().__init__()
        self.norm1 = build_norm_layer(norm_cfg, dim)[1]
        self.attn = attn
        self.pass_block_input = getattr(attn, 'reads_block_input', False)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = build_norm_layer(norm_cfg, dim)[1]
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_cfg, drop)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """x: [B, N, C]; hw: the (H, W) of the map the tokens form."""
        normed = self.norm1(x)
        mixed = self.attn(normed, hw, shortcut=x) if self.pass_block_input else \
            self.attn(normed, hw)
        x = x + self.drop_path(mixed)
        return x + self.drop_path(self.mlp(self.norm2(x)))


def run_blocks(blocks, x: torch.Tensor, hw: Tuple[int, int], with_cp: bool = False) -> torch.Tensor:
    """Apply ``blocks`` in order, with gradient checkpointing when ``with_cp`` and training."""
    from torch.utils.checkpoint import checkpoint
    for blk in blocks:
        if with_cp and x.requires_grad:
            x = checkpoint(blk, x, hw, use_reentrant=False)
        else:
            x = blk(x, hw)
    return x


def stochastic_depth_rates(depths, drop_path_rate: float):
    """Linearly increasing drop-path rates over all blocks, split per stage."""
    total = sum(depths)
    rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]  # = torch.linspace
    out, start = [], 0
    for d in depths:
        out.append(rates[start:start + d])
        start += d
    return out


def parse_block_types(spec: str, depths, family: str):
    """Expand a block-type string into one 'I' / 'S' per block and stage.

    One letter per stage: a letter of :data:`~.attention.ATTN_TYPES` ('I' InLine,
    'S' softmax), or 'M': the stage's first ``n`` blocks are InLine and the rest
    softmax, with ``n`` the number written after the stage letters (the authors'
    'IIMS2'). E.g. ``'IIMS2'`` for four stages.

    Raises:
        ValueError: naming the problem, for a string of the wrong length or letters.
    """
    num_stages = len(depths)
    if not isinstance(spec, str) or len(spec) < num_stages:
        raise ValueError(f'{family}: block types {spec!r} need one letter per stage '
                         f'({num_stages} stages), e.g. {"I" * num_stages!r}')
    letters, tail = spec[:num_stages], spec[num_stages:]
    bad = set(letters) - set(ATTN_TYPES) - {'M'}
    if bad:
        raise ValueError(f'{family}: block types {spec!r} use {sorted(bad)}; the letters are '
                         + describe_attn_types('and', ["'M' (mixed, then a count)"]))
    if 'M' in letters:
        if not tail.isdigit():
            raise ValueError(f"{family}: block types {spec!r} use 'M' but do not end with the "
                             "number of InLine blocks of the mixed stage, e.g. 'IIMS2'")
        n_inline = int(tail)
    elif tail:
        raise ValueError(f'{family}: block types {spec!r} have {len(spec)} letters for '
                         f'{num_stages} stages')
    return [[('I' if j < n_inline else 'S') if letter == 'M' else letter for j in range(depth)]
            for letter, depth in zip(letters, depths)]
