"""CSWin's attention: cross-shaped stripes (or the whole map) plus LePE.

Stripes are windows of shape ``(H, width)`` (vertical) or ``(width, W)`` (horizontal),
cut by :class:`~.window_attention.WindowGrid`; the map is padded to whole stripes
inside and the padded tokens are not real (the mixer's ``Group.real``).
"""
import torch
import torch.nn as nn

from mmplugin_inline.core import stripe_shape

from .attention import MultiHeadAttentionBase
from .linear import Linear
from .mixers import Group, check_heads, mixer_class
from .window_attention import WindowGrid


class CSWinBranch(MultiHeadAttentionBase):
    """One branch of CSWin attention: stripes (or the whole map) plus LePE.

    ``stripe`` is ``None`` for the whole map, else ``(width, vertical)``. Branches of a
    linear mixer ('I', 'L') attend over the whole map only (the authors' setting for
    InLine): the mean token that predicts the residual kernel is one per map, not per
    stripe, so stripes with them raise.
    """

    def __init__(self, dim, num_heads, attn_type, kernel=None, stripe=None, local_residual=True):
        cls = mixer_class(attn_type)
        if cls.linear_in_tokens and stripe is not None:
            raise ValueError(f'{cls.name} CSWin branches (attn_type={cls.letter!r}) attend over '
                             f'the whole map: use stripe=None, got stripe={stripe!r}')
        super().__init__(dim, num_heads, cls, kernel, local_residual)
        self.stripe = stripe
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)

    def forward(self, q, k, v, hw, mean_of=None, real=None):
        """q, k, v: [B, H*W, C] of this branch's channels -> [B, H*W, C].

        ``mean_of``: ``(tokens [B, N, C], real [B, N] or None)`` whose mean is the
        residual's input, one per map (see :class:`~.mixers.Group`). ``real`` (pad-aware
        mode, a :class:`~.padding.RealGrid`): each image's padded tokens are not real;
        their values are zeroed before LePE (a stripe's border then sees zeros, as the
        image alone sees the conv's zero padding). Stripes start at the top left, so an
        image's stripes are the same alone and in the canvas.
        """
        b, n, c = q.shape
        h, w = hw
        # the whole map is one vertical stripe as wide as the map: no padding, no mask
        width, vertical = self.stripe if self.stripe is not None else (w, True)
        grid = WindowGrid(hw, stripe_shape(hw, width, vertical), b,
                          real=None if real is None else real.map_mask(), device=q.device)
        if real is not None:
            v = real.zero(v)
        qw, kw, vw = (grid.cut(t.view(b, h, w, c)) for t in (q, k, v))     # [G, Nw, C]
        out = self.mixer(qw, kw, vw, Group(grid.window, grid.real, mean_of=mean_of))
        return grid.paste(out + self.lepe(vw, grid.window)).reshape(b, n, c)

    def lepe(self, v: torch.Tensor, win) -> torch.Tensor:
        """LePE: the depthwise ``get_v`` conv of V inside each stripe (zero padded at the
        stripe borders); v: [G, wh*ww, C] -> [G, wh*ww, C].

        The stripes' tokens are a channels-last image already: the convolution runs on
        that layout (oneDNN's channels-last depthwise kernel on the CPU, cuDNN's NHWC one
        on the GPU) and its channels-last output is a token view.
        """
        g, _, c = v.shape
        img = v.reshape(g, win[0], win[1], c).permute(0, 3, 1, 2)
        out = self.get_v(img.contiguous(memory_format=torch.channels_last))
        return out.permute(0, 2, 3, 1).reshape(g, -1, c)


class CSWinAttention(nn.Module):
    """CSWin attention: ``qkv``, two half-width stripe branches (or one full branch), ``proj``.

    Blocks of a linear mixer ('I', 'L') use one branch over the whole map (the authors'
    setting, where the InLine split size equals the map size); softmax blocks use
    vertical and horizontal stripes of ``split_size`` in two half-channel branches, or
    one whole-map branch in the last stage. The residual kernel predictor reads the mean
    of the block input (before the norm), as in the authors' code:
    :class:`TransformerBlock` passes it as ``shortcut`` because :attr:`reads_block_input`
    is set.
    """
    #: ask :class:`~mmplugin_inline.models.layers.TransformerBlock` for ``shortcut=x``
    reads_block_input = True

    def __init__(self, dim, num_heads, attn_type='I', split_size=7, last_stage=False,
                 qkv_bias=True, kernel=None, proj_drop=0.0, local_residual=True):
        super().__init__()
        cls = mixer_class(attn_type)
        check_heads(dim, num_heads)
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        # a linear mixer's cost is linear in the tokens: one branch over the whole map
        if cls.linear_in_tokens or last_stage:
            self.attns = nn.ModuleList([CSWinBranch(dim, num_heads, cls, kernel, None,
                                                    local_residual)])
        else:
            if dim % 2 or num_heads % 2:
                raise ValueError(f'two-branch CSWin attention needs an even width and head '
                                 f'count, got dim={dim}, num_heads={num_heads}')
            self.attns = nn.ModuleList([
                CSWinBranch(dim // 2, num_heads // 2, cls, kernel, (split_size, vertical),
                            local_residual)
                for vertical in (True, False)])
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, hw, shortcut=None, real=None):
        """x: normed [B, H*W, C]; shortcut: the block input (for the mean token); real:
        the per-image real tokens in pad-aware mode (:class:`~.padding.RealGrid`): the
        mean token is then the real tokens' mean, and each branch masks the padded ones."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        mean_of = (shortcut if shortcut is not None else x,
                   None if real is None else real.token_mask())
        if len(self.attns) == 1:  # one branch: no split, no concatenation copy
            return self.proj_drop(self.proj(self.attns[0](q, k, v, hw, mean_of, real)))
        split = [t.chunk(2, dim=-1) for t in (q, k, v)]
        out = torch.cat([branch(split[0][i], split[1][i], split[2][i], hw, mean_of, real)
                         for i, branch in enumerate(self.attns)], dim=-1)
        return self.proj_drop(self.proj(out))
