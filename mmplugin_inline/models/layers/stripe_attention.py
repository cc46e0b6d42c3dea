"""CSWin's attention: cross-shaped stripes (or the whole map) plus LePE.

Stripes are windows of shape ``(H, width)`` (vertical) or ``(width, W)`` (horizontal),
cut by :func:`~mmplugin_inline.core.stripe_partition`; the map is padded to whole
stripes inside and padded keys are masked.
"""
import torch
import torch.nn as nn

from mmplugin_inline.core import (crop_to, fast_paths_enabled, nchw_to_nlc, nlc_to_nchw,
                                  pad_to_multiple, stripe_partition, stripe_reverse, stripe_shape)

from .attention import MultiHeadAttentionBase, attention_kind, check_heads
from .linear import Linear
from .padding import key_bias
from .window_attention import shifted_window_mask


class CSWinBranch(MultiHeadAttentionBase):
    """One branch of CSWin attention: stripes (or the whole map) plus LePE.

    ``stripe`` is ``None`` for the whole map, else ``(width, vertical)``. InLine
    branches attend over the whole map only (the authors' setting): the map is then
    one stripe of its own width, never padded, so no padded key reaches the InLine
    statistics. InLine stripes (``stripe`` given with 'I') raise: the mean token that
    predicts the residual kernel is one per map, not per stripe.
    """

    def __init__(self, dim, num_heads, attn_type, kernel='identity', stripe=None):
        if attention_kind(attn_type).reads_mean_token and stripe is not None:
            raise ValueError("InLine CSWin branches (attn_type='I') attend over the whole map: "
                             f'use stripe=None, got stripe={stripe!r}')
        super().__init__(dim, num_heads, attn_type, kernel)
        self.stripe = stripe
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)

    def forward(self, q, k, v, hw, mean_token, valid=None):
        """q, k, v: [B, H*W, C] of this branch's channels -> [B, H*W, C].

        ``valid`` (pad-aware mode, a :class:`~.padding.ValidGrid`): see
        :meth:`_forward_padded`.
        """
        if valid is not None:
            return self._forward_padded(q, k, v, hw, mean_token, valid)
        b, n, c = q.shape
        h, w = hw
        # the whole map is one vertical stripe as wide as the map: no padding, no mask
        width, vertical = self.stripe if self.stripe is not None else (w, True)
        # only the stripe width must divide the map: pad to a multiple of (1, w) or (w, 1)
        multiple = stripe_shape((1, 1), width, vertical)
        maps = [pad_to_multiple(t.view(b, h, w, c), multiple)[0] for t in (q, k, v)]
        hp, wp = maps[0].shape[1:3]
        win = stripe_shape((hp, wp), width, vertical)
        bias = shifted_window_mask((hp, wp), (h, w), win, (0, 0), q.device)
        if bias is not None:
            bias = bias.unsqueeze(1).repeat(b, 1, 1, 1)
        qw, kw, vw = (stripe_partition(t, width, vertical) for t in maps)   # [G, Nw, C]
        lepe = self.lepe(vw, win)
        # each kind reads what it needs: InLine the mean token (its branch is the whole
        # map, never padded: no bias), softmax the padding bias
        out = self.attend(qw, kw, vw, win, mean_token=mean_token, bias=bias)
        out = stripe_reverse(out + lepe, width, vertical, (hp, wp))
        return crop_to(out, hw).reshape(b, n, c)

    def _forward_padded(self, q, k, v, hw, mean_token, valid):
        """Stripes over the canvas with each image's padded tokens masked.

        Padded values are zeroed before LePE (a stripe's border then sees zeros, as the
        image alone sees the conv's zero padding); padded keys leave the InLine
        statistics (key mask; ``mean_token`` is the real tokens' mean) or get a removing
        softmax bias. Stripes start at the top left in both cases, so the image's
        stripes are the same alone and in the canvas.
        """
        b, n, c = q.shape
        h, w = hw
        width, vertical = self.stripe if self.stripe is not None else (w, True)
        multiple = stripe_shape((1, 1), width, vertical)
        v = valid.zero(v)
        maps = [pad_to_multiple(t.view(b, h, w, c), multiple)[0] for t in (q, k, v)]
        real, _ = pad_to_multiple(valid.map_mask().unsqueeze(-1).to(q.dtype), multiple)
        hp, wp = maps[0].shape[1:3]
        win = stripe_shape((hp, wp), width, vertical)
        qw, kw, vw = (stripe_partition(t, width, vertical) for t in maps)   # [G, Nw, C]
        keys = stripe_partition(real, width, vertical).squeeze(-1) > 0     # [G, Nw]
        lepe = self.lepe(vw, win)
        if self.kind.reads_mean_token:
            out = self.attend(qw, kw, vw, win, mean_token=mean_token, key_mask=keys)
        else:
            out = self.attend(qw, kw, vw, win, bias=key_bias(keys, qw.dtype))
        out = stripe_reverse(out + lepe, width, vertical, (hp, wp))
        return crop_to(out, hw).reshape(b, n, c)

    def lepe(self, v: torch.Tensor, win) -> torch.Tensor:
        """LePE: the depthwise ``get_v`` conv of V inside each stripe (zero padded at the
        stripe borders); v: [G, wh*ww, C] -> [G, wh*ww, C].

        The stripes' tokens are a channels-last image already: the convolution runs on
        that layout (oneDNN's channels-last depthwise kernel on the CPU, cuDNN's NHWC one
        on the GPU) and its channels-last output is a token view, where the reference
        transposes to NCHW and back (two copies of V per branch).
        """
        g, _, c = v.shape
        if not fast_paths_enabled():
            return nchw_to_nlc(self.get_v(nlc_to_nchw(v, win)))
        img = v.reshape(g, win[0], win[1], c).permute(0, 3, 1, 2)
        out = self.get_v(img.contiguous(memory_format=torch.channels_last))
        return out.permute(0, 2, 3, 1).reshape(g, -1, c)


class CSWinAttention(nn.Module):
    """CSWin attention: ``qkv``, two half-width stripe branches (or one full branch), ``proj``.

    InLine blocks use one branch over the whole map (the authors' setting, where the
    InLine split size equals the map size); softmax blocks use vertical and horizontal
    stripes of ``split_size`` in two half-channel branches, or one whole-map branch in
    the last stage. The residual kernel predictor reads the mean of the block input
    (before the norm), as in the authors' code: :class:`TransformerBlock` passes it as
    ``shortcut`` because :attr:`reads_block_input` is set.
    """
    #: ask :class:`~mmplugin_inline.models.layers.TransformerBlock` for ``shortcut=x``
    reads_block_input = True

    def __init__(self, dim, num_heads, attn_type='I', split_size=7, last_stage=False,
                 qkv_bias=True, kernel='identity', proj_drop=0.0):
        super().__init__()
        kind = attention_kind(attn_type)
        check_heads(dim, num_heads)
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        # InLine's cost is linear in the tokens: one branch over the whole map
        one_branch = kind.linear_in_tokens or last_stage
        if one_branch:
            self.attns = nn.ModuleList([CSWinBranch(dim, num_heads, kind, kernel, None)])
        else:
            if dim % 2 or num_heads % 2:
                raise ValueError(f'two-branch CSWin attention needs an even width and head '
                                 f'count, got dim={dim}, num_heads={num_heads}')
            self.attns = nn.ModuleList([
                CSWinBranch(dim // 2, num_heads // 2, kind, kernel, (split_size, vertical))
                for vertical in (True, False)])
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, hw, shortcut=None, valid=None):
        """x: normed [B, H*W, C]; shortcut: the block input (for the mean token); valid:
        the per-image real tokens in pad-aware mode (:class:`~.padding.ValidGrid`): the
        mean token is then the real tokens' mean, and each branch masks the padded ones
        (:meth:`CSWinBranch._forward_padded`)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # only InLine branches read the mean token (one branch over the whole map)
        mean = None
        if self.attns[0].kind.reads_mean_token:
            source = shortcut if shortcut is not None else x
            mean = source.mean(dim=1) if valid is None else valid.mean(source)
        if len(self.attns) == 1:  # one branch: no split, no concatenation copy
            return self.proj_drop(self.proj(self.attns[0](q, k, v, hw, mean, valid)))
        split = [t.chunk(2, dim=-1) for t in (q, k, v)]
        out = torch.cat([branch(split[0][i], split[1][i], split[2][i], hw, None, valid)
                         for i, branch in enumerate(self.attns)], dim=-1)
        return self.proj_drop(self.proj(out))
