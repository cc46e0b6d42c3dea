"""Token mixers: what an attention layer does after it has made q, k and v.

A mixer is a small module that owns its parameters and is called the same way by every
attention layer (whole map, spatial reduction, windows, stripes, a cls prefix)::

    out = mixer(q, k, v, Group(hw, real, bias, num_prefix, mean_of=(tokens, real)))

The layers group the tokens and hand each group over, with what the mixer may need about
it in one :class:`Group` (the mean token is computed only when a mixer reads it); they
never ask which mixer it is.
A block letter (the authors' vocabulary, kept in configs: ``'IIIS'``, ``'IIMS2'``)
selects a mixer class in one table, :data:`MIXERS`:

======  ========================  ====================================================
letter  class                     what it computes
======  ========================  ====================================================
'I'     :class:`InLineMixer`      InLine attention (injective: the mean score is
                                  subtracted) plus the local residual
'L'     :class:`LinearMixer`      plain linear attention (sum-normalised, the paper's
                                  baseline) plus the local residual
'S'     :class:`SoftmaxMixer`     softmax attention (SDPA) with an additive bias
======  ========================  ====================================================

``local_residual=False`` builds 'I' and 'L' without the residual and its parameters (the
paper's ablations). Two class attributes tell a family how it may group the tokens:
``linear_in_tokens`` (cost linear in the group size, so a whole map is affordable) and
``takes_bias`` (an additive score bias is defined: relative positions, shifted-window
masks).
"""
from typing import Optional, Tuple, Type, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmplugin_inline.core import (
    NONNEGATIVE_FEATURE_MAPS,
    get_feature_map,
    inline_attention,
    linear_attention,
    local_residual_nhwc,
)
from mmplugin_inline.core.compat import is_exporting

from .padding import key_bias


def check_heads(dim: int, num_heads: int) -> None:
    """Raise a clear error when ``num_heads`` does not divide ``dim``."""
    if num_heads < 1 or dim % num_heads:
        divisors = [n for n in range(1, dim + 1) if dim % n == 0]
        raise ValueError(f'num_heads={num_heads} must divide the width {dim} (each head '
                         f'gets width / num_heads channels): set num_heads in the arch to one '
                         f'of {divisors}, or change the width')


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, N, C] -> [B, heads, N, C // heads]."""
    b, n, c = x.shape
    return x.view(b, n, num_heads, c // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, N, d] -> [B, N, heads * d]."""
    b, h, n, d = x.shape
    x = x.transpose(1, 2)
    if is_exporting():
        # SDPA's traced output strides are [B, N, heads, d] memory (the CPU kernel's), so
        # the graph records this as a view; the ONNX exporter then decomposes SDPA into
        # ops with [B, heads, N, d] memory, where that view fails (InLine-Swin-T's
        # softmax windows). An explicit copy in exported graphs only: eager keeps the
        # free view when the memory allows it
        x = x.clone(memory_format=torch.contiguous_format)
    return x.reshape(b, n, h * d)


class GroupedPointwise(nn.Conv1d):
    """A grouped ``Conv1d`` with kernel 1, run on one token per sample as one batched
    matrix product over the groups.

    A subclass, so that its parameters, state-dict keys and type are ``Conv1d``'s (the
    authors' checkpoints load as they are; LoRA, quantisation and hooks see a ``Conv1d``)
    and takes ``Conv1d``'s input, [B, Cin, 1] -> [B, Cout, 1]. On such an input it computes
    the same product as the convolution with ``bmm``: a convolution call on a length-1
    sequence costs more in set-up (oneDNN on the CPU, cuDNN on the GPU) than its few
    multiply-adds. Any other input runs the convolution.
    """

    def __init__(self, in_channels: int, out_channels: int, groups: int = 1, bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size=1, groups=groups, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != 1:
            return super().forward(x)
        g, b = self.groups, x.shape[0]
        cin, cout = self.in_channels // g, self.out_channels // g
        w = self.weight.view(g, cout, cin).transpose(1, 2)              # [g, Cin/g, Cout/g]
        xg = x.view(b, g, cin).transpose(0, 1)                         # [g, B, Cin/g]
        y = torch.bmm(xg, w) if self.bias is None else \
            torch.baddbmm(self.bias.view(g, 1, cout), xg, w)           # [g, B, Cout/g]
        return y.transpose(0, 1).reshape(b, g * cout, 1)


class ResidualKernelPredictor(nn.Sequential):
    """Predicts the per-sample 3x3 depthwise kernels of the local residual.

    ``Conv1d(C, C, 1, groups=heads) -> GELU -> Conv1d(C, 9C, 1, groups=heads)`` on the
    mean token; output [B, C, 3, 3]. The modules are the authors' (their checkpoints
    load as they are), each run through its own ``forward``: the convolutions are
    :class:`GroupedPointwise` (a ``Conv1d`` computed as grouped matrix products).
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__(GroupedPointwise(dim, dim, groups=num_heads), nn.GELU(),
                         GroupedPointwise(dim, dim * 9, groups=num_heads))

    def forward(self, mean_token: torch.Tensor) -> torch.Tensor:  # [B, C] -> [B, C, 3, 3]
        b, c = mean_token.shape
        return super().forward(mean_token.unsqueeze(-1)).view(b, c, 3, 3)


def masked_mean(tokens: torch.Tensor, real: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The mean of each group's real tokens: tokens [G, N, C], real bool [G, N] or None
    (all real) -> [G, C]."""
    if real is None:
        return tokens.mean(dim=1)
    total = torch.where(real.unsqueeze(-1), tokens, tokens.new_zeros(())).sum(dim=1)
    return total / real.sum(dim=1, keepdim=True).clamp_min(1).to(tokens.dtype)


class Group:
    """What a mixer is told about the groups of tokens it attends within.

    Args:
        hw (tuple[int, int], optional): the map the last ``N - num_prefix`` value tokens
            form (the local residual's image).
        real (Tensor, optional): bool [G, N] over the keys, true on a real token (prefix
            tokens are real). A token that is not real (padding to whole windows, the
            pad-aware mode's batch padding) leaves every statistic, and its value is zero
            for the local residual. None: all real, no mask work.
        bias (Tensor, optional): additive score bias broadcastable to [G, heads, N, N];
            only for mixers with ``takes_bias``.
        num_prefix (int): leading tokens (cls) left out of the local residual.
        mean_of (tuple, optional): ``(tokens [G, M, C], real [G, M] or None)``: the mean
            token (:attr:`mean_token`) is the mean of their real tokens, computed when a
            mixer first reads it.
    """
    __slots__ = ('hw', 'real', 'bias', 'num_prefix', '_mean_of', '_mean')

    def __init__(self, hw: Optional[Tuple[int, int]] = None, real: Optional[torch.Tensor] = None,
                 bias: Optional[torch.Tensor] = None, num_prefix: int = 0,
                 mean_of: Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]] = None):
        self.hw, self.real, self.bias, self.num_prefix = hw, real, bias, num_prefix
        self._mean_of, self._mean = mean_of, None

    @property
    def mean_token(self) -> torch.Tensor:
        """[G, C]: the mean of the real tokens of ``mean_of`` (the residual's input)."""
        if self._mean is None:
            if self._mean_of is None:
                raise ValueError('this group was given no tokens for its mean token (mean_of)')
            self._mean = masked_mean(*self._mean_of)
        return self._mean


class Mixer(nn.Module):
    """Base of the token mixers: multi-head attention over projected q, k, v.

    Args:
        dim (int): width of q, k, v.
        num_heads (int): number of heads.
        kernel (str, optional): feature map phi of the linear mixers; None takes the
            mixer's own default. Softmax has no feature map and ignores it.
        local_residual (bool): build the local residual (linear mixers). Default: True.

    Attributes:
        letter (str): its letter in block-type strings.
        name (str): its name in messages.
        linear_in_tokens (bool): cost linear in the group size, so a family may attend
            over the whole map at any size; otherwise it bounds the group by windows,
            stripes or spatial reduction.
        takes_bias (bool): an additive score bias (relative positions, shift masks) is
            defined for it.
    """
    letter = ''
    name = ''
    linear_in_tokens = False
    takes_bias = False

    def __init__(self, dim: int, num_heads: int, kernel: Optional[str] = None,
                 local_residual: bool = True):
        super().__init__()
        check_heads(dim, num_heads)
        self.dim, self.num_heads = dim, num_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                group: Optional[Group] = None) -> torch.Tensor:
        """Attend within each group of tokens.

        Args:
            q, k, v (Tensor): [G, N, C] (G groups: batch x windows); k and v may have
                another length than q (spatial reduction).
            group (Group, optional): what the mixer needs about the groups (map size,
                real-token mask, bias, prefix length, mean token); None: all real, no
                bias, no prefix (a mixer that needs a map or a mean token raises).

        Returns:
            Tensor: [G, Nq, C].
        """
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f'dim={self.dim}, num_heads={self.num_heads}'


_NO_GROUP = Group()


class SoftmaxMixer(Mixer):
    """Softmax attention through SDPA, with an optional additive bias.

    Keys that are not real get the removing bias of :func:`~.padding.key_bias` (finite:
    a query whose keys are all padding stays finite; its output is cropped away).
    """
    letter, name = 'S', 'softmax'
    takes_bias = True

    def forward(self, q, k, v, group=None):
        group = group or _NO_GROUP
        bias = group.bias
        if bias is not None:
            bias = bias.to(q.dtype)
        if group.real is not None:
            removed = key_bias(group.real, q.dtype)                        # [G, 1, 1, N]
            bias = removed if bias is None else bias + removed
        h = self.num_heads
        out = F.scaled_dot_product_attention(split_heads(q, h), split_heads(k, h),
                                             split_heads(v, h), attn_mask=bias)
        return merge_heads(out)


class LinearCostMixer(Mixer):
    """Base of the mixers whose cost is linear in the tokens: a feature map phi, an
    attention function of [B, heads, N, d] tensors, and the local residual.

    The local residual is a 3x3 depthwise convolution of V (as an image), one kernel per
    sample and channel, predicted by :class:`ResidualKernelPredictor` (``residual``, the
    authors' name) from the mean token.
    """
    linear_in_tokens = True
    #: phi when ``kernel`` is None
    default_kernel = 'identity'

    def __init__(self, dim, num_heads, kernel=None, local_residual=True):
        super().__init__(dim, num_heads)
        self.kernel = self.check_kernel(self.default_kernel if kernel is None else kernel)
        self.local_residual = bool(local_residual)
        if self.local_residual:
            self.residual = ResidualKernelPredictor(dim, num_heads)
        else:
            self.residual = None

    def check_kernel(self, kernel: str) -> str:
        """``kernel`` if this mixer can use it; an unknown name fails here, at build."""
        get_feature_map(kernel)
        return kernel

    def attention(self, q, k, v, real=None) -> torch.Tensor:
        """The attention itself: [B, heads, N, d] in and out; ``real`` the keys' mask."""
        raise NotImplementedError

    def forward(self, q, k, v, group=None):
        group = group or _NO_GROUP
        if group.bias is not None:
            raise ValueError(f'{self.name} attention takes no additive bias (relative '
                             'positions and shifted windows are softmax only)')
        h = self.num_heads
        out = merge_heads(self.attention(split_heads(q, h), split_heads(k, h), split_heads(v, h),
                                         group.real))
        if self.residual is not None:
            if group.hw is None:
                raise ValueError(f'{self.name} attention with its local residual needs the '
                                 'map of the value tokens (Group.hw) and their mean token')
            self._add_local_residual(out, v, group)
        return out

    def _add_local_residual(self, out, v, group: Group) -> None:
        """``out[:, num_prefix:] +=`` the local residual of ``v`` (in place)."""
        weights = self.residual(group.mean_token)                     # [G, C, 3, 3]
        g, _, c = v.shape
        p, hw = group.num_prefix, group.hw
        v = v[:, p:]
        if group.real is not None:  # values that are not real -> 0 (zero padding at the border)
            v = v * group.real[:, p:].unsqueeze(-1).to(v.dtype)
        # tokens are a channels-last map already: no transpose to NCHW and back
        res = local_residual_nhwc(v.reshape(g, hw[0], hw[1], c), weights)
        # added in place into the attention output (a fresh tensor): no third N x C
        # tensor, and the prefix rows (cls) are left as they are
        out[:, p:].view(g, hw[0], hw[1], c).add_(res)

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, kernel={self.kernel!r}, ' \
               f'local_residual={self.local_residual}'


class InLineMixer(LinearCostMixer):
    """InLine attention (:func:`~mmplugin_inline.core.inline_attention`): the mean score
    subtracted instead of a division by the sum; plus the local residual."""
    letter, name = 'I', 'InLine'

    def attention(self, q, k, v, real=None):
        return inline_attention(q, k, v, kernel=self.kernel, real_keys=real)


class LinearMixer(LinearCostMixer):
    """Plain linear attention (:func:`~mmplugin_inline.core.linear_attention`), the paper's
    baseline: ``phi(q_i) phi(K)^T V / (phi(q_i) . sum_j phi(k_j) + eps)``; plus the local
    residual.

    phi must keep the normaliser positive: a non-negative map
    (:data:`~mmplugin_inline.core.NONNEGATIVE_FEATURE_MAPS`), ReLU by default as in the
    paper's baseline. Identity and LeakyReLU, which can make it zero or negative, raise.
    """
    letter, name = 'L', 'linear'
    default_kernel = 'relu'

    def check_kernel(self, kernel: str) -> str:
        super().check_kernel(kernel)
        if kernel not in NONNEGATIVE_FEATURE_MAPS:
            raise ValueError(
                f"plain linear attention ('L' blocks) divides by phi(q) . sum phi(k), which "
                f'kernel={kernel!r} can make zero or negative; use a non-negative feature '
                f'map, one of {list(NONNEGATIVE_FEATURE_MAPS)} (kernel=None takes '
                f'{self.default_kernel!r})')
        return kernel

    def attention(self, q, k, v, real=None):
        return linear_attention(q, k, v, kernel=self.kernel, real_keys=real)


#: block-type letter -> mixer class: the one mapping from letters to behaviour
MIXERS = {cls.letter: cls for cls in (InLineMixer, SoftmaxMixer, LinearMixer)}


def describe_attn_types(conjunction: str = 'or', extra=()) -> str:
    """The letters of :data:`MIXERS` for messages: "'I' (InLine), 'S' (softmax) or 'L' (linear)".

    ``extra`` descriptions are appended; the last item is joined by ``conjunction``.
    """
    items = [f'{letter!r} ({cls.name})' for letter, cls in MIXERS.items()] + list(extra)
    return f' {conjunction} '.join([', '.join(items[:-1]), items[-1]]) if len(items) > 1 \
        else items[0]


def mixer_class(attn_type: Union[str, Type[Mixer]]) -> Type[Mixer]:
    """The mixer class of a block letter (a :class:`Mixer` subclass is returned as it is).

    Raises:
        ValueError: for a letter that is not in :data:`MIXERS`, naming the letters.
    """
    if isinstance(attn_type, type) and issubclass(attn_type, Mixer):
        return attn_type
    if isinstance(attn_type, str) and attn_type in MIXERS:
        return MIXERS[attn_type]
    raise ValueError(f'attn_type must be {describe_attn_types()}, got {attn_type!r}')


def build_mixer(attn_type, dim: int, num_heads: int, kernel: Optional[str] = None,
                local_residual: bool = True) -> Mixer:
    """The mixer of a block letter (or :class:`Mixer` subclass), built."""
    return mixer_class(attn_type)(dim, num_heads, kernel=kernel, local_residual=local_residual)


def parse_block_types(spec: str, depths, family: str):
    """Read a block-type string into one letter per block and stage.

    One letter per stage, a key of :data:`MIXERS` ('I', 'S', 'L'), or 'M': the stage's
    first ``n`` blocks are InLine and the rest softmax, with ``n`` the number written
    after the stage letters (the authors' 'IIMS2'). E.g. ``'IIMS2'`` for four stages.

    Raises:
        ValueError: naming the problem, for a string of the wrong length or letters.
    """
    num_stages = len(depths)
    if not isinstance(spec, str) or len(spec) < num_stages:
        raise ValueError(f'{family}: block types {spec!r} need one letter per stage '
                         f'({num_stages} stages), e.g. {"I" * num_stages!r}')
    letters, tail = spec[:num_stages], spec[num_stages:]
    bad = set(letters) - set(MIXERS) - {'M'}
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
