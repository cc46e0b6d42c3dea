"""The transformer block shared by every family; the attention module is an argument."""
from typing import Tuple

import torch
import torch.nn as nn
from timm.layers import DropPath
from torch.utils.checkpoint import checkpoint

from .factories import build_act, build_norm
from .linear import Linear

try:  # selective checkpointing (torch >= 2.4); without it 'mlp' recomputes the whole half
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
except ImportError:  # pragma: no cover
    create_selective_checkpoint_contexts = None


class Mlp(nn.Module):
    """``fc1 -> act -> drop -> fc2 -> drop`` (the authors' names, so weights load as they are)."""

    def __init__(self, dim: int, hidden_dim: int, act_cfg=dict(type='GELU'), drop: float = 0.0):
        super().__init__()
        self.fc1 = Linear(dim, hidden_dim)
        self.act = build_act(act_cfg)
        self.fc2 = Linear(hidden_dim, dim)
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
        self.norm1 = build_norm(norm_cfg, dim)
        self.attn = attn
        self.pass_block_input = getattr(attn, 'reads_block_input', False)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = build_norm(norm_cfg, dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_cfg, drop)

    def attn_branch(self, x: torch.Tensor, hw: Tuple[int, int], real=None) -> torch.Tensor:
        """The first residual branch, ``DP(attn(LN(x)))`` (what ``with_cp='attn'`` recomputes).

        ``real`` (pad-aware mode, a :class:`~.padding.RealGrid`) is handed to the
        attention as ``real=``; None calls it without.
        """
        normed = self.norm1(x)
        extra = {} if real is None else {'real': real}
        mixed = self.attn(normed, hw, shortcut=x, **extra) if self.pass_block_input else \
            self.attn(normed, hw, **extra)
        return self.drop_path(mixed)

    def mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        """The second residual branch, ``DP(MLP(LN(x)))`` (what ``with_cp='mlp'`` recomputes)."""
        return self.drop_path(self.mlp(self.norm2(x)))

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], with_cp=False,
                real=None) -> torch.Tensor:
        """x: [B, N, C]; hw: the (H, W) of the map the tokens form; ``real``: the
        per-image real tokens in pad-aware mode (an argument, so a recomputation in the
        backward pass gets it too), else None.

        ``with_cp`` ('attn' or 'mlp'; see :data:`WITH_CP_MODES`) recomputes that branch in
        the backward pass instead of keeping its activations (only when ``x`` needs a
        gradient). The branch input is kept ('mlp' also keeps the C-wide outputs of norm2
        and fc2, so that only fc1 and the activation are recomputed: see
        :func:`_narrow_outputs_policy`); the residual addition is outside the recomputed
        part (an addition keeps nothing for its backward). The RNG state is restored for
        the recomputation, so drop-path draws the same mask.
        """
        cp = with_cp if x.requires_grad else False
        if cp == 'attn':
            x = x + checkpoint(self.attn_branch, x, hw, real, use_reentrant=False)
        else:
            x = x + self.attn_branch(x, hw, real)
        if cp == 'mlp':
            return x + checkpoint(self.mlp_branch, x, use_reentrant=False,
                                  context_fn=_keep_narrow_outputs)
        return x + self.mlp_branch(x)


def _narrow_outputs_policy(ctx, op, *args, **kwargs):
    """Keep the outputs of matrix products that narrow their input (the MLP's ``fc2``) and
    of layer norms; recompute the rest (``fc1`` and the activation, 8x wide in PVT's
    stage 1). The backward then redoes one of the MLP's two products, not both: the
    recomputation stops once ``fc2``'s saved input (the activation) is rebuilt, and
    ``fc2`` itself is looked up, not run again."""
    aten = torch.ops.aten
    if op in (aten.addmm.default, aten.mm.default):
        a, b = args[-2:]
        if b.shape[-1] < a.shape[-1]:
            return CheckpointPolicy.MUST_SAVE
    if op is aten.convolution.default:  # a linear layer run by oneDNN (core.matmul_backend)
        weight = args[1]
        if weight.shape[0] < weight.shape[1]:
            return CheckpointPolicy.MUST_SAVE
    if op is aten.native_layer_norm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _keep_narrow_outputs():
    if create_selective_checkpoint_contexts is None:  # pragma: no cover
        from contextlib import nullcontext
        return nullcontext(), nullcontext()
    return create_selective_checkpoint_contexts(_narrow_outputs_policy)


#: the values of a backbone's ``with_cp``: no recomputation, the whole block, or the
#: norm + attention half / the norm + MLP half of every block
WITH_CP_MODES = (False, True, 'attn', 'mlp')


def check_with_cp(with_cp, owner: str = 'with_cp'):
    """``with_cp`` if it is one of :data:`WITH_CP_MODES`, else a ValueError naming them."""
    # the type test keeps 0 / 1 out (they compare equal to False / True)
    if isinstance(with_cp, (bool, str)) and with_cp in WITH_CP_MODES:
        return with_cp
    raise ValueError(f"{owner}: with_cp must be one of False, True, 'attn' or 'mlp' (False: "
                     "no recomputation, True: whole blocks, 'attn' / 'mlp': the attention / "
                     f"MLP half of each block), got {with_cp!r}")


def run_blocks(blocks, x: torch.Tensor, hw: Tuple[int, int], with_cp=False,
               real=None) -> torch.Tensor:
    """Apply ``blocks`` in order, recomputing what ``with_cp`` says while training.

    ``with_cp`` is one of :data:`WITH_CP_MODES`: True checkpoints each whole block,
    'attn' / 'mlp' that half of each block (:meth:`TransformerBlock.forward`). Nothing is
    recomputed when ``x`` needs no gradient (inference, frozen stages). The backbones
    check the value once, when they are built (:func:`check_with_cp`).

    ``real`` (pad-aware mode: a :class:`~.padding.RealGrid` of this map, with
    ``num_prefix`` leading tokens taken as real) goes to every block, and the padded
    tokens of the result are set to zero, so that a strided or spatial layer after the
    stage sees zeros there, as the image alone sees its zero padding.
    """
    for blk in blocks:
        if with_cp is True and x.requires_grad:
            x = checkpoint(blk, x, hw, False, real, use_reentrant=False)
        else:
            x = blk(x, hw, with_cp, real)
    return x if real is None else real.zero(x, x.shape[1] - hw[0] * hw[1])


def stochastic_depth_rates(depths, drop_path_rate: float):
    """Linearly increasing drop-path rates over all blocks, split per stage."""
    total = sum(depths)
    rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]  # = torch.linspace
    out, start = [], 0
    for d in depths:
        out.append(rates[start:start + d])
        start += d
    return out
