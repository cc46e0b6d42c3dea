"""Parameter and FLOP counts with mmengine's jit analysis, extended for attention.

mmengine's :class:`~mmengine.analysis.FlopAnalyzer` traces the model and counts the
ops it has handlers for. Two ops that attention layers use have none:

- ``aten::scaled_dot_product_attention`` (softmax blocks): two matmuls,
  ``Q K^T`` and ``P V``, i.e. ``L * S * (d + dv)`` per head for L queries and S keys;
- ``aten::baddbmm(input, b1 [G, n, m], b2 [G, m, p])``: ``G * n * m * p`` (the added
  ``input`` is not counted). The InLine kernel uses it for the rank-one centring of
  its d x d matrix, ``M = (s / N) (phi(K)^T V - N mean(phi(K))^T mean(V))``: ``G * d * dv``.

An autograd Function (``prim::PythonOp``, e.g. a kernel with a hand-written backward)
is counted from the forward ops the tracer records inside it. Everything else the
InLine kernel and its local residual use is already counted correctly by mmengine:
``phi(K)^T V`` (``aten::matmul``), the output ``Q @ M`` (``aten::bmm``,
``G * N * d * dv``; ``mean(V)`` is then added in place, ``aten::add_``, element-wise),
the grouped 1x1 ``Conv1d`` of the kernel predictor and the per-sample depthwise
``conv2d`` with ``groups = B * C`` (both ``aten::_convolution``: weight
``[out, in / groups, k]`` makes the count ``out * in / groups * k * outputs``).

Convention (mmengine's and fvcore's, and the one of the InLine / Swin / PVT papers'
tables): one fused multiply-add counts as one FLOP, so the figures are multiply-
accumulates (MACs). Element-wise ops (additions, scaling, activations, softmax
exponentials) are not counted, nor are NMS and RoIAlign (as in mmdet's get_flops);
they are listed in :data:`UNCOUNTED_OPS` and reported apart from ops that are truly
unknown, which the tools print as a warning.
"""
import typing
from collections import Counter
from math import prod
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer, parameter_count
from mmengine.analysis.jit_handles import elementwise_flop_counter, get_shape

#: ``aten`` ops the SDPA handler serves; the private variants are what some
#: backends record, with q, k, v as their first three inputs as well.
SDPA_OPS = ('aten::scaled_dot_product_attention', 'aten::_scaled_dot_product_attention_math',
            'aten::_scaled_dot_product_flash_attention',
            'aten::_scaled_dot_product_flash_attention_for_cpu',
            'aten::_scaled_dot_product_efficient_attention',
            'aten::_scaled_dot_product_cudnn_attention')

#: Element-wise / reduction ops deliberately left out of the count (MAC convention).
UNCOUNTED_ELEMENTWISE_OPS = frozenset({
    'aten::add', 'aten::add_', 'aten::sub', 'aten::sub_', 'aten::mul', 'aten::mul_',
    'aten::div', 'aten::div_', 'aten::rsub', 'aten::neg', 'aten::pow', 'aten::sqrt',
    'aten::rsqrt', 'aten::exp', 'aten::exp_', 'aten::log', 'aten::log2', 'aten::erf',
    'aten::sigmoid', 'aten::sigmoid_', 'aten::tanh', 'aten::gelu', 'aten::silu', 'aten::silu_',
    'aten::leaky_relu', 'aten::leaky_relu_', 'aten::hardswish', 'aten::reciprocal',
    'aten::abs', 'aten::sign', 'aten::round', 'aten::softmax', 'aten::log_softmax',
    'aten::mean', 'aten::sum', 'aten::cumsum', 'aten::max_pool2d', 'aten::avg_pool2d',
    'aten::where', 'aten::lt', 'aten::le', 'aten::ne', 'aten::any', 'aten::all',
    'aten::logical_and', 'aten::logical_or', 'aten::__or__', 'aten::__xor__',
    'aten::bitwise_or', 'aten::bitwise_and', 'aten::argmax', 'aten::topk', 'aten::sort',
    'aten::min', 'aten::minimum', 'aten::maximum',
})

#: Non-matmul ops of detection heads that mmdet's own get_flops leaves uncounted as well:
#: suppression (no arithmetic to speak of) and RoI sampling (bilinear interpolation).
UNCOUNTED_SAMPLING_OPS = frozenset({
    'prim::PythonOp.NMSop', 'prim::PythonOp.RoIAlignFunction', 'torchvision::nms',
    'torchvision::roi_align', 'aten::grid_sampler_2d',
})

#: Bookkeeping ops (copies, layout, indexing, constants, dropout in eval) that mmengine
#: does not already ignore.
ZERO_COST_OPS = frozenset({
    'aten::lift_fresh', 'aten::lift', 'aten::resolve_conj', 'aten::resolve_neg', 'aten::alias',
    'aten::detach_', 'aten::as_strided', 'aten::expand', 'aten::expand_as', 'aten::view',
    'aten::view_as', 'aten::reshape', 'aten::clone', 'aten::repeat', 'aten::repeat_interleave',
    'aten::pad', 'aten::index_select', 'aten::masked_select', 'aten::fill_', 'aten::zero_',
    'aten::new_ones', 'aten::ones_like', 'aten::linspace', 'aten::meshgrid',
    'aten::feature_dropout', 'aten::dropout_', 'aten::alpha_dropout',
    'aten::feature_alpha_dropout',
})

#: Every op left out of the count on purpose.
UNCOUNTED_OPS = UNCOUNTED_ELEMENTWISE_OPS | UNCOUNTED_SAMPLING_OPS | ZERO_COST_OPS


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """MACs of softmax attention: ``Q K^T`` then ``softmax(.) V``.

    q ``[..., L, d]``, k ``[..., S, d]``, v ``[..., S, dv]`` -> ``prod(...) * L * S * (d + dv)``.
    The softmax, scaling and mask addition are element-wise (not counted); a causal
    mask is counted as the full matrix (an upper bound).
    """
    q, k, v = (get_shape(x) for x in inputs[:3])
    batch = prod(q[:-2])
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def baddbmm_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """MACs of ``baddbmm(input, b1 [G, n, m], b2 [G, m, p])``: ``G * n * m * p``.

    As mmengine's ``addmm`` handler, the added ``input`` (a bias) is not counted.
    """
    b1, b2 = get_shape(inputs[1]), get_shape(inputs[2])
    return b1[0] * b1[1] * b1[2] * b2[2]


#: The handlers added to mmengine's defaults. Bicubic resizing (DeiT's position
#: embedding at another size) reads 16 inputs per output, as bilinear (4) in mmengine.
EXTRA_FLOP_HANDLES = {
    **{op: sdpa_flop_jit for op in SDPA_OPS},
    'aten::baddbmm': baddbmm_flop_jit,
    'aten::upsample_bicubic2d': elementwise_flop_counter(0, 16),
}


class _HandleTable(dict):
    """mmengine's op-kind -> handle table, plus autograd Functions counted from inside.

    A ``torch.autograd.Function`` (``prim::PythonOp.<Name>``) without a handle of its own
    is counted by running the table over the forward subgraph the tracer records in
    the node (``Subgraph``): a custom kernel written as a Function (e.g. InLine's with
    a hand-written backward) is counted by its real matmuls instead of being skipped.
    Ops inside it that have no handle, and Functions with an opaque body (a C
    extension, numpy: no arithmetic op traced inside), are recorded in ``inner_unknown``.
    Functions listed in :data:`UNCOUNTED_OPS` (NMS, RoIAlign) keep being reported as
    not counted.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.inner_unknown: typing.Counter[str] = Counter()
        self.ignored: Set[str] = set()

    def __contains__(self, kind) -> bool:
        return super().__contains__(kind) or self._is_fallback(kind)

    def __getitem__(self, kind):
        if not super().__contains__(kind) and self._is_fallback(kind):
            return self._count_python_op
        return super().__getitem__(kind)

    @staticmethod
    def _is_fallback(kind) -> bool:
        return isinstance(kind, str) and kind.startswith('prim::PythonOp.') and \
            kind not in UNCOUNTED_OPS

    def _count_python_op(self, inputs: List[Any], outputs: List[Any]) -> typing.Counter[str]:
        node = outputs[0].node()
        name = f'prim::PythonOp.{node.pyname()}'
        if not node.hasAttribute('Subgraph'):
            self.inner_unknown[name] += 1
            return Counter()
        counts: typing.Counter[str] = Counter()
        traced_any = False
        for inner in node.g('Subgraph').nodes():
            kind = inner.kind()
            if kind == 'prim::PythonOp':
                kind = f'{kind}.{inner.pyname()}'
            if (kind.startswith('prim::') and not kind.startswith('prim::PythonOp')) or \
                    kind in self.ignored or kind in ZERO_COST_OPS:
                continue
            traced_any = True
            if kind in self:
                found = self[kind](list(inner.inputs()), list(inner.outputs()))
                if not isinstance(found, Counter):
                    found = Counter({kind.split('::')[-1]: found})
                counts += found
            elif kind not in UNCOUNTED_OPS:
                self.inner_unknown[f'{name}/{kind}'] += 1
        if not traced_any:
            self.inner_unknown[name] += 1  # opaque body: nothing could be counted
        return counts


def flop_analyzer(model: nn.Module, inputs: Union[torch.Tensor, Tuple[Any, ...]],
                  warn_uncalled: bool = False) -> FlopAnalyzer:
    """A :class:`FlopAnalyzer` with :data:`EXTRA_FLOP_HANDLES` added and autograd
    Functions counted from their traced forward (see :class:`_HandleTable`).

    No warnings are logged for ops without a handler: :func:`unknown_ops` lists those
    that are not left out by design (:data:`UNCOUNTED_OPS`); any such op is not counted.
    """
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**EXTRA_FLOP_HANDLES)
    # mmengine 0.10 keeps the table in ``_op_handles`` and only looks ops up in it
    table = _HandleTable(analyzer._op_handles)
    table.ignored = analyzer._ignored_ops
    analyzer._op_handles = table
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(warn_uncalled)
    return analyzer


def unknown_ops(analyzer: FlopAnalyzer, module_name: str = '') -> Dict[str, int]:
    """Ops of ``module_name`` that were not counted and are not in :data:`UNCOUNTED_OPS`,
    including ops inside autograd Functions (for the whole model only: ``'func/op'``)."""
    unknown = {op: n for op, n in analyzer.unsupported_ops(module_name).items()
               if op not in UNCOUNTED_OPS}
    table = analyzer._op_handles
    if not module_name and isinstance(table, _HandleTable):
        unknown.update(table.inner_unknown)
    return unknown


def count_module(model: nn.Module, inputs: Union[torch.Tensor, Tuple[Any, ...]],
                 submodules: Sequence[str] = ()) -> Dict[str, Any]:
    """Trace ``model(*inputs)`` once; FLOPs (MACs) and params of it and ``submodules``.

    Returns:
        dict: ``flops`` / ``params`` (whole), ``sub`` = {name: (flops, params)} for
        each name in ``submodules`` that exists, ``unknown_ops`` (see
        :func:`unknown_ops`), ``uncounted_ops`` (left out by design) and the
        ``analyzer`` for further breakdowns.
    """
    if not isinstance(inputs, tuple):
        inputs = (inputs, )
    with torch.no_grad():
        analyzer = flop_analyzer(model, inputs)
        try:
            flops = analyzer.total()
        except RuntimeError as exc:
            raise RuntimeError(
                f'counting FLOPs traces the model with torch.jit (mmengine FlopAnalyzer) and '
                f'the trace of {type(model).__name__} failed: {exc}') from exc
    params = parameter_count(model)
    unsupported = analyzer.unsupported_ops()
    names = dict(model.named_modules())
    return dict(
        flops=flops,
        params=params[''],
        sub={name: (analyzer.total(name), params.get(name, 0)) for name in submodules
             if name in names},
        unknown_ops=unknown_ops(analyzer),
        uncounted_ops={op: n for op, n in unsupported.items() if op in UNCOUNTED_OPS},
        analyzer=analyzer)


def module_table(analyzer: FlopAnalyzer, max_depth: int = 3) -> str:
    """mmengine's per-module table of parameters and FLOPs (MACs) up to ``max_depth``."""
    from mmengine.analysis.print_helper import complexity_stats_table
    return complexity_stats_table(flops=analyzer, max_depth=max_depth, show_param_shapes=False)


def format_count(n: Optional[float], unit: float = 1e9) -> str:
    """``n / unit`` with two decimals (``-`` for None)."""
    return '-' if n is None else f'{n / unit:.2f}'
