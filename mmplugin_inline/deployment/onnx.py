"""ONNX export of an InLine backbone or an mmseg segmentor (tensor mode), and its
verification with onnxruntime against PyTorch; the tool is
``tools/deployment/pytorch2onnx.py`` (:mod:`mmplugin_inline.cli.pytorch2onnx`).

The export goes through torch's own exporter: ``torch.export`` with batch, height and
width left dynamic (``Dim.AUTO``), then ``torch.onnx.export`` of the exported program
(the dynamo-based path, torch's default). The TorchScript-based exporter
(``dynamo=False``) cannot export these models with a dynamic batch: the local residual
is one depthwise convolution with ``groups = B * C``, and it rejects a convolution
whose kernel shape is unknown. ONNX's ``Conv`` also needs ``group`` as a constant, so
that convolution is written as its 3x3 taps while ``torch.export`` traces the model
(``core.local_residual_taps``, taken by ``local_residual_nhwc`` when
``torch.compiler.is_exporting()``); a convolution with a size-dependent group count
left in the exported program (the NCHW reference path) is decomposed into taps there
(:func:`conv2d_dynamic_groups`). Eager runs are not changed. The translated graph is
shrunk before torch's ONNX optimiser runs (:func:`optimize_program`).

The example input has batch 2 (a batch of 1 would fix the batch size); the exported
program's ranges for batch, H and W are printed. A size that the model branches on
(Swin's shift is off in a stage whose map is no larger than the window) is a range
limit: export at a size like the ones you will run.

Verification (the tool's ``--verify``) is :mod:`.verify`, the preprocessing record of a
whole model :mod:`.metadata`, and the module to export of a config :mod:`.build`.
"""
import os
import os.path as osp
from typing import List, Optional, Sequence, Tuple

#: max abs error accepted by --verify (fp32; measured errors are ~1e-6, see README)
DEFAULT_TOLERANCE = 1e-4
DEFAULT_OPSET = 18
EXAMPLE_BATCH = 2
INPUT_NAME = 'input'  # the graph's image input: the normalised image tensor


def conv2d_dynamic_groups(input, weight, bias=None, stride=(1, 1), padding=(0, 0),
                          dilation=(1, 1), groups=1):
    """``aten.conv2d`` whose ``groups`` depends on the input size, as a sum of its taps.

    The local residual convolves each sample with its own kernels: one depthwise
    convolution of ``[1, B*C, H, W]`` with ``groups = B*C``. With a dynamic batch,
    ``groups`` is symbolic and ONNX ``Conv`` cannot take it; the same convolution is
    the sum over the kh x kw taps of a shifted slice of the padded input times that
    tap's weight per channel. Any other convolution is left to the exporter
    (``NotImplemented``).
    """
    from ..core import depthwise_conv_taps
    if isinstance(groups, int):
        return NotImplemented
    if weight.shape[1] != 1 or tuple(stride) != (1, 1) or tuple(dilation) != (1, 1):
        raise NotImplementedError(
            'only depthwise, stride 1, dilation 1 convolutions with a size-dependent group '
            f'count can be exported; got weight {tuple(weight.shape)}, stride {stride}, '
            f'dilation {dilation}')
    out = depthwise_conv_taps(input, weight, padding)
    return out if bias is None else out + bias.view(1, -1, 1, 1)


def _has_dynamic_group_conv(exported) -> bool:
    """Whether ``exported`` (an ``ExportedProgram``) holds a convolution whose group count
    depends on the input size (a separate decomposition pass, tens of seconds for a T
    backbone, rewrites those; the backbones' local residual already exports as taps)."""
    import torch
    for node in exported.graph.nodes:
        if node.op == 'call_function' and node.target is torch.ops.aten.conv2d.default:
            groups = node.args[6] if len(node.args) > 6 else node.kwargs.get('groups', 1)
            if not isinstance(groups, int):
                return True
    return False


class exportable_upsampling:
    """Within the block, mmseg's ``Upsample`` modules with an integer scale factor compute
    their output size as ``size * factor`` instead of ``int(size * factor)``.

    The two are equal for integer factors, but ``torch.export`` specialises ``int()`` of a
    symbolic float to the example's value (a guard the ONNX graph drops): Semantic FPN's
    scale heads then upsample to the example's map size at every input size and the
    logits come out wrong (max abs error ~1 at 61x83 for an export at 64x96). The
    modules' own ``forward`` is restored on exit, so verification compares with the
    model as it is.
    """

    def __init__(self, module):
        self.module, self.patched = module, []

    def __enter__(self):
        import types
        try:
            from mmseg.models.utils import Upsample, resize
        except ImportError:  # mmseg not installed: nothing of it to patch
            return self

        def forward(up, x):
            factor = int(up.scale_factor)
            return resize(x, [t * factor for t in x.shape[-2:]], None, up.mode,
                          up.align_corners)

        for m in self.module.modules():
            if isinstance(m, Upsample) and not m.size and isinstance(m.scale_factor, float) \
                    and m.scale_factor.is_integer():
                m.forward = types.MethodType(forward, m)
                self.patched.append(m)
        return self

    def __exit__(self, *exc):
        for m in self.patched:
            del m.forward  # back to the class's forward
        return False


def segmentor_tensor_mode(segmentor):
    """A module whose ``forward(inputs)`` is the mmseg segmentor's tensor mode."""
    import torch.nn as nn

    class SegmentorTensorMode(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, inputs):
            return self.model(inputs, None, mode='tensor')

    return SegmentorTensorMode(segmentor)


def segmentor_labels(segmentor):
    """A module whose ``forward(inputs)`` is the label map ``[B, H, W]`` int64 at the
    input's size: the tensor mode's logits resized to the input (bilinear, the decode
    head's ``align_corners``) and their argmax over the classes (a threshold of the
    sigmoid for one output channel), as mmseg's ``predict`` computes them for an image
    of the input's size (``postprocess_result``)."""
    import torch.nn as nn

    class SegmentorLabels(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model
            head = model.decode_head
            self.align_corners = bool(head.align_corners)
            self.threshold = getattr(head, 'threshold', 0.3) if head.out_channels == 1 \
                else None

        def forward(self, inputs):
            import torch.nn.functional as F
            logits = self.model(inputs, None, mode='tensor')
            logits = F.interpolate(logits, size=inputs.shape[2:], mode='bilinear',
                                   align_corners=self.align_corners)
            if self.threshold is not None:
                return (logits.sigmoid() > self.threshold)[:, 0].long()
            return logits.argmax(dim=1)

    return SegmentorLabels(segmentor)


def _bound(value) -> Optional[int]:
    """A range bound of ``torch.export`` as an int; None for infinity (``int_oo``)."""
    try:
        bound = int(value)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None
    return None if bound >= 2 ** 62 else bound


def _dim_ranges(exported) -> List[Tuple[object, object]]:
    """(min, max) of each dimension of the exported program's first input; an int
    where the export fixed that dimension."""
    placeholder = next(n for n in exported.graph.nodes
                       if n.op == 'placeholder' and n.name in exported.graph_signature.user_inputs)
    ranges = []
    for size in placeholder.meta['val'].shape:
        if isinstance(size, int):
            ranges.append(size)
            continue
        vr = exported.range_constraints[size.node.expr]
        ranges.append((_bound(vr.lower), _bound(vr.upper)))
    return ranges


#: the names of an image batch's dimensions, in order, for messages
DIM_NAMES = ('batch', 'C', 'H', 'W')


def describe_range(name: str, r) -> str:
    if isinstance(r, int):
        return f'{name} fixed to {r}'
    low, high = r
    return f'{name} {low}..{"inf" if high is None else high}'


def export_onnx(module, shape: Tuple[int, int], out: str, opset: int = DEFAULT_OPSET,
                in_channels: int = 3, batch: int = EXAMPLE_BATCH,
                output_names: Optional[Sequence[str]] = None,
                metadata: Optional[dict] = None) -> dict:
    """Export ``module`` (eval mode, one image tensor ``input`` in) with dynamic H and W,
    and a dynamic batch unless ``batch`` is 1 (the whole detectors take one image).

    ``output_names`` name the graph's outputs; ``metadata`` (str -> str) is written into
    the file's ``metadata_props``. Returns ``dict(path, ranges=[batch, C, H, W] as (min,
    max) or a fixed int, seconds)``. Raises ValueError when the export fixed the batch
    (if dynamic), height or width.
    """
    import time

    import torch
    start = time.perf_counter()
    module.eval()
    example = torch.randn(batch, in_channels, *shape,
                          generator=torch.Generator().manual_seed(0))
    # a module with more inputs than the image (the whole detectors' img_hw) says so
    args = module.example_inputs(example) if hasattr(module, 'example_inputs') else (example,)
    input_names = list(getattr(module, 'input_names', [INPUT_NAME]))
    auto = torch.export.Dim.AUTO
    dims = {2: auto, 3: auto} if batch == 1 else {0: auto, 2: auto, 3: auto}
    with torch.no_grad(), exportable_upsampling(module):
        exported = torch.export.export(module, args,
                                       dynamic_shapes=(dims,) + (None,) * (len(args) - 1))
        if _has_dynamic_group_conv(exported):  # the models' own residual writes its taps
            exported = exported.run_decompositions(
                {torch.ops.aten.conv2d.default: conv2d_dynamic_groups})
    ranges = _dim_ranges(exported)
    names = ('batch' if batch != 1 else None, None, 'height', 'width')
    fixed = [name for name, r in zip(names, ranges) if name and isinstance(r, int)]
    if fixed:
        raise ValueError(
            f'the export fixed the {", ".join(fixed)} of the input to the example\'s '
            f'({", ".join(describe_range(n, r) for n, r in zip(DIM_NAMES, ranges))}): '
            'the model branches on that size; export at another --shape, or see the '
            'limits in the README (Deployment: ONNX)')
    program = torch.onnx.export(exported, args, dynamo=True, opset_version=opset,
                                input_names=input_names,
                                output_names=list(output_names) if output_names else None,
                                optimize=False, verbose=False)
    optimize_program(program)
    for key, value in (metadata or {}).items():
        program.model.metadata_props[key] = value
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    program.save(out)
    return dict(path=out, ranges=ranges, seconds=time.perf_counter() - start)


def optimize_program(program) -> None:
    """torch's ONNX optimisation of ``program`` (an ``ONNXProgram``), in place, after a
    first pass that merges repeated subexpressions.

    Every block repeats the size arithmetic of the dynamic shapes (pads, window and
    stripe shapes, reshape targets), so the translated graph holds the same small
    expressions many times over: InLine-CSWin-T's has 22,743 nodes, 7,560 of them
    constants. onnxscript's optimizer folds constants and then runs its rewrite rules,
    whose pattern matching grows faster than the graph, and merges common
    subexpressions only at the end: on that graph it had not finished after 10 minutes.
    Lifting the constants, deduplicating them and merging common subexpressions first
    (about 1 s) leaves 4,451 nodes, on which the same optimiser takes 13 s (3,402
    nodes after; onnxruntime gives the same outputs to 2e-6). Nothing here changes
    what the graph computes.
    """
    import onnx_ir as ir
    from onnx_ir.passes import common
    ir.passes.Sequential(
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.RemoveUnusedNodesPass())(program.model)
    program.optimize()


def onnx_operators(path: str) -> List[str]:
    """The operators of the ONNX file ``path`` (``domain::Op`` outside the default
    domain), sorted, subgraphs included."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    ops = set()

    def walk(graph):
        for node in graph.node:
            ops.add(node.op_type if node.domain in ('', 'ai.onnx')
                    else f'{node.domain}::{node.op_type}')
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    walk(attr.g)
    walk(model.graph)
    for function in model.functions:
        walk(function)
    return sorted(ops)
