"""Parameter and FLOP counts with mmengine's jit analysis, extended for attention.

mmengine's :class:`~mmengine.analysis.FlopAnalyzer` traces the model and counts the
ops it has handlers for. :data:`FLOP_HANDLES` is the table this module counts with:
mmengine's default handlers (its public functions in
``mmengine.analysis.jit_handles``) and three it lacks:

- ``aten::scaled_dot_product_attention`` (softmax blocks): two matmuls,
  ``Q K^T`` and ``P V``, i.e. ``L * S * (d + dv)`` per head for L queries and S keys;
- ``aten::baddbmm(input, b1 [G, n, m], b2 [G, m, p])``: ``G * n * m * p`` (the added
  ``input`` is not counted). The local residual's kernel predictor uses it for its
  grouped 1x1 convolutions with a bias, run as one batched product over the groups;
- ``aten::upsample_bicubic2d`` (DeiT's position embedding resized to another grid).

An autograd Function (``prim::PythonOp.<Name>``, e.g. the InLine kernel with its
hand-written backward) gets a handle of its own that counts the forward ops the tracer
records inside it with the same table. The InLine kernel's ops are all in that table:
the centred ``(phi(K) - mean)^T (V - mean(V))`` and the output ``Q @ M`` are
``aten::bmm`` (``G * N * d * dv`` each); the centring, the scaling and the added
``mean(V)`` are element-wise. The local residual's per-sample depthwise ``conv2d``
(``groups = B * C``) is ``aten::_convolution``: weight ``[out, in / groups, k]`` makes
the count ``out * in / groups * k * outputs``.

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
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer, parameter_count
from mmengine.analysis.jit_handles import (
    Handle,
    addmm_flop_jit,
    batchnorm_flop_jit,
    bmm_flop_jit,
    conv_flop_jit,
    einsum_flop_jit,
    elementwise_flop_counter,
    get_shape,
    linear_flop_jit,
    matmul_flop_jit,
    norm_flop_counter,
)

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
    # also skipped by mmengine's analyzer at the top level of the trace
    'aten::relu', 'aten::relu_', 'aten::clamp', 'aten::clamp_', 'aten::max', 'aten::eq',
    'aten::ge', 'aten::gt', 'aten::__and__', 'aten::bitwise_not', 'aten::floor',
    'aten::floor_divide', 'aten::remainder', 'aten::masked_fill',
})

#: Non-matmul ops of detection heads that mmdet's own get_flops leaves uncounted as well:
#: suppression (no arithmetic to speak of) and RoI sampling (bilinear interpolation).
UNCOUNTED_SAMPLING_OPS = frozenset({
    'prim::PythonOp.NMSop', 'prim::PythonOp.RoIAlignFunction', 'torchvision::nms',
    'torchvision::roi_align', 'aten::grid_sampler_2d',
})

#: Bookkeeping ops: copies, layout, indexing, constants, integer arithmetic on sizes,
#: dropout in eval. Inside an autograd Function they do not count as traced arithmetic
#: (a body of nothing else is opaque). mmengine's analyzer skips most of them itself at
#: the top level of the trace; this list is kept here in full so that the count inside a
#: Function does not depend on mmengine's private one.
ZERO_COST_OPS = frozenset({
    'aten::lift_fresh', 'aten::lift', 'aten::resolve_conj', 'aten::resolve_neg', 'aten::alias',
    'aten::detach_', 'aten::as_strided', 'aten::expand', 'aten::expand_as', 'aten::view',
    'aten::view_as', 'aten::reshape', 'aten::clone', 'aten::repeat', 'aten::repeat_interleave',
    'aten::pad', 'aten::index_select', 'aten::masked_select', 'aten::fill_', 'aten::zero_',
    'aten::new_ones', 'aten::ones_like', 'aten::linspace', 'aten::meshgrid',
    'aten::feature_dropout', 'aten::dropout_', 'aten::alpha_dropout',
    'aten::feature_alpha_dropout',
    # also skipped by mmengine's analyzer at the top level of the trace
    'aten::Int', 'aten::ScalarImplicit', 'aten::size', 'aten::arange', 'aten::cat',
    'aten::stack', 'aten::chunk', 'aten::split', 'aten::split_with_sizes', 'aten::unbind',
    'aten::narrow', 'aten::select', 'aten::slice', 'aten::index', 'aten::index_put_',
    'aten::gather', 'aten::nonzero', 'aten::roll', 'aten::constant_pad_nd',
    'aten::contiguous', 'aten::copy_', 'aten::detach', 'aten::dropout', 'aten::to',
    'aten::type_as', 'aten::flatten', 'aten::permute', 'aten::transpose', 'aten::t',
    'aten::squeeze', 'aten::unsqueeze', 'aten::unsqueeze_', 'aten::empty', 'aten::new_empty',
    'aten::new_full', 'aten::new_zeros', 'aten::full', 'aten::full_like', 'aten::ones',
    'aten::zeros', 'aten::zeros_like',
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


#: The FLOP handlers, set over ``FlopAnalyzer``'s own and used inside autograd Functions:
#: mmengine's defaults (the same ops and weights as its table, written with its public
#: handler functions; tests/analysis/test_flop_handles.py checks that they count alike)
#: and :data:`EXTRA_FLOP_HANDLES`. Bilinear resizing and ``grid_sampler`` read 4 inputs per
#: output, nearest 1; an adaptive average pool reads each input once.
FLOP_HANDLES: Dict[str, Handle] = {
    'aten::addmm': addmm_flop_jit,
    'aten::bmm': bmm_flop_jit,
    'aten::_convolution': conv_flop_jit,
    'aten::einsum': einsum_flop_jit,
    'aten::matmul': matmul_flop_jit,
    'aten::mm': matmul_flop_jit,
    'aten::linear': linear_flop_jit,
    'aten::batch_norm': batchnorm_flop_jit,
    'aten::group_norm': norm_flop_counter(2),
    'aten::layer_norm': norm_flop_counter(2),
    'aten::instance_norm': norm_flop_counter(1),
    'aten::upsample_nearest2d': elementwise_flop_counter(0, 1),
    'aten::upsample_bilinear2d': elementwise_flop_counter(0, 4),
    'aten::adaptive_avg_pool2d': elementwise_flop_counter(1, 0),
    'aten::grid_sampler': elementwise_flop_counter(0, 4),
    **EXTRA_FLOP_HANDLES,
}

PYTHON_OP = 'prim::PythonOp'


def autograd_function_classes() -> Iterator[Type[torch.autograd.Function]]:
    """Every subclass of ``torch.autograd.Function`` defined so far (at any depth)."""
    seen = set()
    todo = list(torch.autograd.Function.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        yield cls


def node_kind(node) -> str:
    """The op kind of a traced node as mmengine names it: an autograd Function is
    ``prim::PythonOp.<class name>``."""
    kind = node.kind()
    return f'{kind}.{node.pyname()}' if kind == PYTHON_OP else kind


class InLineFlopAnalyzer(FlopAnalyzer):
    """mmengine's :class:`FlopAnalyzer` counting with :data:`FLOP_HANDLES`, autograd
    Functions counted from the forward ops traced inside them.

    :data:`FLOP_HANDLES` and one handle per autograd Function class defined when the
    analyzer is made (``prim::PythonOp.<Name>``) are set through the public
    ``set_op_handle``, over mmengine's defaults (the same handlers for the same ops);
    Functions in :data:`UNCOUNTED_OPS` (mmcv's NMS and RoIAlign) get none and stay
    reported as not counted.
    A Function's handle runs the same table over the forward subgraph the tracer records
    in its node (``Subgraph``), so a kernel written as a Function (InLine's, with its
    hand-written backward) is counted by its real matmuls instead of being skipped; a
    Function nested inside is counted the same way.

    Ops inside a Function that have no handle, and Functions with an opaque body (a C
    extension, numpy: no arithmetic op traced inside), are added to
    :attr:`function_unknown` (``'prim::PythonOp.F/aten::op'``, or the Function's own
    kind) while the analysis runs. A Function class defined after the analyzer is made
    has no handle: it is reported by ``unsupported_ops`` as any unknown op.

    Args:
        model (nn.Module): the model to trace.
        inputs (Tensor or tuple): its inputs.

    Attributes:
        flop_handles (dict): op kind -> handle, the table installed in the analyzer.
        function_unknown (Counter): what could not be counted inside autograd Functions.
    """

    def __init__(self, model: nn.Module, inputs: Union[torch.Tensor, Tuple[Any, ...]]):
        super().__init__(model, inputs)
        self.function_unknown: typing.Counter[str] = Counter()
        self.flop_handles: Dict[str, Handle] = dict(FLOP_HANDLES)
        for cls in autograd_function_classes():
            kind = f'{PYTHON_OP}.{cls.__name__}'
            if kind not in UNCOUNTED_OPS and kind not in self.flop_handles:
                self.flop_handles[kind] = self.count_autograd_function
        self.set_op_handle(**self.flop_handles)

    def count_autograd_function(self, inputs: List[Any],
                                outputs: List[Any]) -> typing.Counter[str]:
        """The handle of a ``prim::PythonOp`` node: the FLOPs of its traced forward."""
        node = outputs[0].node()
        name = node_kind(node)
        if not node.hasAttribute('Subgraph'):
            self.function_unknown[name] += 1
            return Counter()
        counts: typing.Counter[str] = Counter()
        traced_any = False
        for inner in node.g('Subgraph').nodes():
            kind = node_kind(inner)
            if (kind.startswith('prim::') and not kind.startswith(PYTHON_OP)) or \
                    kind in ZERO_COST_OPS:
                continue
            traced_any = True
            handle = self.flop_handles.get(kind)
            if handle is not None:
                found = handle(list(inner.inputs()), list(inner.outputs()))
                if not isinstance(found, Counter):
                    found = Counter({kind.split('::')[-1]: found})
                counts += found
            elif kind not in UNCOUNTED_OPS:
                self.function_unknown[f'{name}/{kind}'] += 1
        if not traced_any:
            self.function_unknown[name] += 1  # opaque body: nothing could be counted
        return counts


def flop_analyzer(model: nn.Module, inputs: Union[torch.Tensor, Tuple[Any, ...]],
                  warn_uncalled: bool = False) -> FlopAnalyzer:
    """An :class:`InLineFlopAnalyzer` of ``model(*inputs)`` with mmengine's warnings off.

    No warnings are logged for ops without a handler: :func:`unknown_ops` lists those
    that are not left out by design (:data:`UNCOUNTED_OPS`); any such op is not counted.
    ``warn_uncalled`` keeps mmengine's warning for modules the trace never called.
    """
    analyzer = InLineFlopAnalyzer(model, inputs)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(warn_uncalled)
    return analyzer


def unknown_ops(analyzer: FlopAnalyzer, module_name: str = '') -> Dict[str, int]:
    """Ops of ``module_name`` that were not counted and are not in :data:`UNCOUNTED_OPS`,
    including ops inside autograd Functions (for the whole model only: ``'func/op'``)."""
    unknown = {op: n for op, n in analyzer.unsupported_ops(module_name).items()
               if op not in UNCOUNTED_OPS}
    if not module_name and isinstance(analyzer, InLineFlopAnalyzer):
        unknown.update(analyzer.function_unknown)
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
