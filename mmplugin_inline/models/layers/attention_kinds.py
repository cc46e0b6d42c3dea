"""The two attention kinds of the InLine backbones, and the one place that reads a block letter.

A block-type string (``'IIIS'``, ``'IIMS2'``: the authors' vocabulary, kept in
configs) names one letter per block. :func:`attention_kind` reads a letter once, at
build time, into an :class:`AttentionKind` object; from then on the layers ask the
object what to do, never the letter:

================================  ==========================  ==========================
what the layers ask               :data:`INLINE` (``'I'``)     :data:`SOFTMAX` (``'S'``)
================================  ==========================  ==========================
``attend(module, q, k, v, ...)``  InLine + local residual     softmax (SDPA)
``linear_in_tokens``              True: the whole map is      False: windows, stripes or
                                  affordable                  spatial reduction
``reads_mean_token``              True (the residual's        False
                                  kernel predictor)
``can_shift``                     False                       True (Swin's SW-MSA)
``relative_position_bias``        False                       True (Swin's windows)
================================  ==========================  ==========================
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmplugin_inline.core import (fast_paths_enabled, inline_attention, local_residual,
                                  local_residual_nhwc, nchw_to_nlc, nlc_to_nchw)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, N, C] -> [B, heads, N, C // heads]."""
    b, n, c = x.shape
    return x.view(b, n, num_heads, c // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, N, d] -> [B, N, heads * d]."""
    b, h, n, d = x.shape
    x = x.transpose(1, 2)
    if torch.compiler.is_exporting():
        # SDPA's traced output strides are [B, N, heads, d] memory (the CPU kernel's), so
        # the graph records this as a view; the ONNX exporter then decomposes SDPA into
        # ops with [B, heads, N, d] memory, where that view fails (InLine-Swin-T's
        # softmax windows). An explicit copy in exported graphs only: eager keeps the
        # free view when the memory allows it
        x = x.clone(memory_format=torch.contiguous_format)
    return x.reshape(b, n, h * d)


def grouped_pointwise(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """``conv`` (a grouped ``Conv1d`` of kernel size 1) on one token per sample: [B, Cin] -> [B, Cout].

    The same product as ``conv(x.unsqueeze(-1)).squeeze(-1)``, as one batched matrix
    product over the groups: a convolution call on a length-1 sequence costs more in
    set-up (oneDNN on the CPU, cuDNN on the GPU) than its few multiply-adds.
    """
    g = conv.groups
    cin, cout = conv.in_channels // g, conv.out_channels // g
    w = conv.weight.view(g, cout, cin).transpose(1, 2)                  # [g, Cin/g, Cout/g]
    xg = x.view(x.shape[0], g, cin).transpose(0, 1)                    # [g, B, Cin/g]
    y = torch.bmm(xg, w) if conv.bias is None else \
        torch.baddbmm(conv.bias.view(g, 1, cout), xg, w)               # [g, B, Cout/g]
    return y.transpose(0, 1).reshape(x.shape[0], g * cout)


class ResidualKernelPredictor(nn.Sequential):
    """Predicts the per-sample 3x3 depthwise kernels of the local residual.

    ``Conv1d(C, C, 1, groups=heads) -> GELU -> Conv1d(C, 9C, 1, groups=heads)`` on the
    mean token; output [B, C, 3, 3]. The modules are the authors' (their checkpoints
    load as they are); :meth:`forward` runs them as grouped matrix products
    (:func:`grouped_pointwise`), :meth:`forward_reference` as the convolutions.
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__(
            nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads), nn.GELU(),
            nn.Conv1d(dim, dim * 9, kernel_size=1, groups=num_heads))

    def forward(self, mean_token: torch.Tensor) -> torch.Tensor:  # [B, C] -> [B, C, 3, 3]
        if not fast_paths_enabled():
            return self.forward_reference(mean_token)
        b, c = mean_token.shape
        hidden = self[1](grouped_pointwise(mean_token, self[0]))
        return grouped_pointwise(hidden, self[2]).view(b, c, 3, 3)

    def forward_reference(self, mean_token: torch.Tensor) -> torch.Tensor:
        """The same kernels through the ``Conv1d`` modules (the check of :meth:`forward`)."""
        b, c = mean_token.shape
        return super().forward(mean_token.unsqueeze(-1)).view(b, c, 3, 3)


class AttentionKind:
    """How a block attends. One instance per kind (:data:`INLINE`, :data:`SOFTMAX`).

    Attributes:
        letter (str): its letter in block-type strings.
        name (str): its name in messages.
        linear_in_tokens (bool): cost linear in the token count, so a block of this kind
            attends over the whole map at any size; otherwise the families bound the
            cost by windows (Swin), stripes (CSWin) or spatial reduction (PVT).
        reads_mean_token (bool): :meth:`attend` needs the mean token of the group.
        can_shift (bool): shifted windows (SW-MSA) are defined for it.
        relative_position_bias (bool): windows of this kind learn a relative position bias.
    """
    letter = ''
    name = ''
    linear_in_tokens = False
    reads_mean_token = False
    can_shift = False
    relative_position_bias = False

    def build(self, module: nn.Module) -> None:
        """Add this kind's own parameters to ``module`` (an attention layer)."""

    def attend(self, module, q, k, v, hw: Optional[Tuple[int, int]] = None, mean_token=None,
               num_prefix: int = 0, bias=None, key_mask=None) -> torch.Tensor:
        """See :meth:`~.attention.MultiHeadAttentionBase.attend`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f'{self.name} ({self.letter!r})'

    def __reduce__(self):  # one instance per kind, also after pickling / deep copies
        return attention_kind, (self.letter,)


class InLineKind(AttentionKind):
    """InLine attention plus the local residual (kernels predicted from the mean token)."""
    letter, name = 'I', 'InLine'
    linear_in_tokens = True
    reads_mean_token = True

    def build(self, module: nn.Module) -> None:
        module.residual = ResidualKernelPredictor(module.dim, module.num_heads)

    def attend(self, module, q, k, v, hw=None, mean_token=None, num_prefix=0, bias=None,
               key_mask=None):
        h = module.num_heads
        out = merge_heads(inline_attention(split_heads(q, h), split_heads(k, h), split_heads(v, h),
                                           kernel=module.kernel, key_mask=key_mask))
        weights = module.residual(mean_token)                        # [G, C, 3, 3]
        g, _, c = v.shape
        v = v[:, num_prefix:]
        if key_mask is not None:  # padded V -> 0 (the prefix tokens' mask entries skipped)
            v = v * key_mask[:, num_prefix:].unsqueeze(-1).to(v.dtype)
        if not fast_paths_enabled():  # the NCHW grouped convolution, then a concatenation
            res = nchw_to_nlc(local_residual(nlc_to_nchw(v, hw), weights))
            if num_prefix:
                return torch.cat([out[:, :num_prefix], out[:, num_prefix:] + res], dim=1)
            return out + res
        # tokens are a channels-last map already: no transpose to NCHW and back
        res = local_residual_nhwc(v.reshape(g, hw[0], hw[1], c), weights)
        # added in place into the attention output (a fresh tensor): no third N x C
        # tensor, and the prefix rows (cls) are left as they are
        out[:, num_prefix:].view(g, hw[0], hw[1], c).add_(res)
        return out


class SoftmaxKind(AttentionKind):
    """Softmax attention through SDPA, with an optional additive bias (masks, positions)."""
    letter, name = 'S', 'softmax'
    can_shift = True
    relative_position_bias = True

    def attend(self, module, q, k, v, hw=None, mean_token=None, num_prefix=0, bias=None,
               key_mask=None):
        h = module.num_heads
        if bias is not None:
            bias = bias.to(q.dtype)
        out = F.scaled_dot_product_attention(split_heads(q, h), split_heads(k, h),
                                             split_heads(v, h), attn_mask=bias)
        return merge_heads(out)


INLINE = InLineKind()
SOFTMAX = SoftmaxKind()

#: block-type letter -> attention kind: the one mapping from letters to behaviour
ATTN_KINDS = {kind.letter: kind for kind in (INLINE, SOFTMAX)}
#: block-type letter -> the name of the attention it selects (for messages)
ATTN_TYPES = {letter: kind.name for letter, kind in ATTN_KINDS.items()}


def describe_attn_types(conjunction: str = 'or', extra=()) -> str:
    """The letters of :data:`ATTN_KINDS` for messages: ``"'I' (InLine) or 'S' (softmax)"``.

    ``extra`` descriptions are appended; the last item is joined by ``conjunction``.
    """
    items = [f'{letter!r} ({name})' for letter, name in ATTN_TYPES.items()] + list(extra)
    return f' {conjunction} '.join([', '.join(items[:-1]), items[-1]]) if len(items) > 1 \
        else items[0]


def attention_kind(attn_type: Union[str, AttentionKind]) -> AttentionKind:
    """The :class:`AttentionKind` of a block letter (a kind is returned as it is).

    Raises:
        ValueError: for a letter that is not in :data:`ATTN_KINDS`, naming the letters.
    """
    if isinstance(attn_type, AttentionKind):
        return attn_type
    if isinstance(attn_type, str) and attn_type in ATTN_KINDS:
        return ATTN_KINDS[attn_type]
    raise ValueError(f'attn_type must be {describe_attn_types()}, got {attn_type!r}')


def parse_block_types(spec: str, depths, family: str):
    """Read a block-type string into one attention kind per block and stage.

    The families read their ``block_types`` here, once: the layers receive
    :class:`AttentionKind` objects. One letter per stage: 'I' (InLine), 'S' (softmax),
    or 'M': the stage's first ``n`` blocks are InLine and the rest softmax, with ``n``
    the number written after the stage letters (the authors' 'IIMS2'). E.g.
    ``'IIMS2'`` for four stages.

    Raises:
        ValueError: naming the problem, for a string of the wrong length or letters.
    """
    num_stages = len(depths)
    if not isinstance(spec, str) or len(spec) < num_stages:
        raise ValueError(f'{family}: block types {spec!r} need one letter per stage '
                         f'({num_stages} stages), e.g. {"I" * num_stages!r}')
    letters, tail = spec[:num_stages], spec[num_stages:]
    bad = set(letters) - set(ATTN_KINDS) - {'M'}
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
    return [[(INLINE if j < n_inline else SOFTMAX) if letter == 'M' else ATTN_KINDS[letter]
             for j in range(depth)] for letter, depth in zip(letters, depths)]
