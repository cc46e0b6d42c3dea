"""The shared attention base of the InLine backbones, and global attention.

:class:`MultiHeadAttentionBase` owns what every attention layer shares: the mixer that
runs after q, k, v (:mod:`.mixers`, selected by the block letter once, at build).
Its subclasses differ only in how they group tokens: the whole map
(:class:`GlobalAttention`, here), windows (``window_attention.py``, Swin) or
cross-shaped stripes (``stripe_attention.py``, CSWin). Each has one forward path; a
token that is not real (padding to whole windows, the pad-aware mode's batch padding)
reaches the mixer in its :class:`~.mixers.Group` (``real``).

The mixer is a registered child (``attn.mixer``): what runs is what ``named_modules``
shows, so tools that swap or wrap modules (LoRA, FSDP, quantisation, hooks) reach it.
Its parameters are therefore ``attn.mixer.residual.*``; the authors' ``attn.residual.*``
are renamed on loading (each family's ``checkpoint_filter`` and the legacy-key upgrade of
the backbones). The other names follow the authors' checkpoints (``qkv`` or ``q`` /
``kv``, ``proj``, ``relative_position_bias_table``, ``get_v``, ``sr``).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from mmplugin_inline.core import nchw_to_nlc, nlc_to_nchw, pad_to_multiple

from .linear import Linear
from .mixers import Group, build_mixer

__all__ = ['MultiHeadAttentionBase', 'GlobalAttention']


class MultiHeadAttentionBase(nn.Module):
    """An attention layer around a :class:`~.mixers.Mixer`.

    Subclasses project the tokens, group them (map, windows, stripes) and call
    :attr:`mixer` on each group.

    The mixer is a registered child, :attr:`mixer`, that creates and owns its parameters
    (InLine's ``residual``: ``attn.mixer.residual.0.weight``).

    Args:
        dim (int): width of q, k, v.
        num_heads (int): number of heads.
        attn_type (str | type): a block letter of :data:`~.mixers.MIXERS` ('I', 'S',
            'L') or a :class:`~.mixers.Mixer` subclass. Default: 'I'.
        kernel (str, optional): feature map of the linear mixers; None: the mixer's own
            default ('identity' for InLine, 'relu' for 'L').
        local_residual (bool): linear mixers with their local residual. Default: True.
    """

    def __init__(self, dim: int, num_heads: int, attn_type='I', kernel: Optional[str] = None,
                 local_residual: bool = True):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        # created first: the seeded initialisation and the parameter order (optimizer
        # state) depend on it
        self.mixer = build_mixer(attn_type, dim, num_heads, kernel, local_residual)

    @property
    def attn_type(self) -> str:
        """The block letter of :attr:`mixer`."""
        return self.mixer.letter

    def extra_repr(self) -> str:
        return f'dim={self.dim}, num_heads={self.num_heads}'


class GlobalAttention(MultiHeadAttentionBase):
    """Attention over the whole map (PVT, DeiT, Swin's InLine blocks).

    Args:
        dim (int): width.
        num_heads (int): heads.
        attn_type (str | type): 'I', 'S' or 'L' (see :class:`MultiHeadAttentionBase`).
            Default: 'I'.
        qkv_bias (bool): bias in the input projections. Default: True.
        kernel (str, optional): feature map of the linear mixers. Default: None.
        separate_q (bool): ``q`` and ``kv`` projections (PVT) instead of one ``qkv``.
        sr_ratio (int): spatial reduction of keys / values for softmax attention
            (PVT's SRA): a strided conv then LayerNorm. Default: 1 (none).
        num_prefix (int): leading non-spatial tokens (DeiT's cls token). Default: 0.
        proj_drop (float): dropout after the output projection. Default: 0.
        local_residual (bool): see :class:`MultiHeadAttentionBase`. Default: True.
    """

    def __init__(self, dim, num_heads, attn_type='I', qkv_bias=True, kernel=None,
                 separate_q=False, sr_ratio=1, num_prefix=0, proj_drop=0.0,
                 local_residual=True):
        super().__init__(dim, num_heads, attn_type, kernel, local_residual)
        self.separate_q, self.num_prefix, self.sr_ratio = separate_q, num_prefix, sr_ratio
        if separate_q:
            self.q = Linear(dim, dim, bias=qkv_bias)
            self.kv = Linear(dim, dim * 2, bias=qkv_bias)
        else:
            self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        if sr_ratio > 1:
            if self.mixer.linear_in_tokens or num_prefix:
                raise ValueError('spatial reduction (sr_ratio > 1) applies to softmax attention '
                                 "on maps without prefix tokens (attn_type='S')")
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def project(self, x: torch.Tensor, kv_source: Optional[torch.Tensor] = None):
        """q from ``x``, k and v from ``kv_source`` (default ``x``); each [B, N, C]."""
        kv_source = x if kv_source is None else kv_source
        if self.separate_q:
            return (self.q(x), *self.kv(kv_source).chunk(2, dim=-1))
        return self.qkv(x).chunk(3, dim=-1)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], real=None) -> torch.Tensor:
        """x: [B, num_prefix + H*W, C] (normed tokens), hw = (H, W) -> [B, N, C].

        ``real`` (a :class:`~.padding.RealGrid`, pad-aware mode): each image's padded
        tokens are not real: they leave the mixer's statistics (key mask; the mean token
        is the real tokens' mean, prefix tokens counted), and with spatial reduction they
        are zeroed before the strided conv, so a reduced token sees what the image alone
        gives it, and reduced tokens without a real one are masked.
        """
        p = self.num_prefix
        kv_source, real_tokens = x, None if real is None else real.token_mask(p)
        real_keys = real_tokens
        if self.sr_ratio > 1:
            # pad to whole reduction cells so maps of any size (even smaller) reduce
            x_map, _ = pad_to_multiple(nlc_to_nchw(x if real is None else real.zero(x), hw),
                                       (self.sr_ratio,) * 2, channels_last=False)
            reduced = self.sr(x_map)
            kv_source = self.norm(nchw_to_nlc(reduced))
            if real is not None:  # the reduced grid's real tokens
                real_keys = real.down(self.sr_ratio, reduced.shape[2:]).token_mask()
        q, k, v = self.project(x, kv_source)
        out = self.mixer(q, k, v, Group(hw, real_keys, num_prefix=p, mean_of=(x, real_tokens)))
        return self.proj_drop(self.proj(out))

