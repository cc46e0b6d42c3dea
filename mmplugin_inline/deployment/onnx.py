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

Verification (:func:`verify_onnx`, the tool's ``--verify``) runs the ONNX file with
onnxruntime on the CPU against PyTorch on the same random inputs at each size, with batch
1 and 2; :func:`check_rows` names the outputs of another shape or above the tolerance.
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


def default_verify_shapes(shape: Tuple[int, int]) -> List[Tuple[int, int]]:
    """Two sizes other than ``shape``, neither side a multiple of 32 (nor even)."""
    h, w = shape

    def odd(n):
        n = max(n, 33)
        return n + 1 if n % 2 == 0 else n
    return [(odd(h - h // 4), odd(w + w // 8)), (odd(h + h // 3), odd(w - w // 5))]


def verify_onnx(module, path: str, shapes: Sequence[Tuple[int, int]],
                batches: Sequence[int] = (1, EXAMPLE_BATCH), in_channels: int = 3,
                seed: int = 0) -> List[dict]:
    """Run ``path`` with onnxruntime (CPU) and ``module`` in PyTorch on the same random
    inputs; one row per batch size, size and output: ``batch, hw, output, shape
    (PyTorch), onnx_shape, max_abs_err`` (None when the shapes differ)."""
    import numpy as np
    import onnxruntime as ort
    import torch
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    name = session.get_inputs()[0].name
    gen = torch.Generator().manual_seed(seed)
    rows = []
    module.eval()
    for h, w in shapes:
        for b in batches:
            x = torch.randn(b, in_channels, h, w, generator=gen)
            with torch.no_grad():
                ref = module(x)
            ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
            got = session.run(None, {name: x.numpy()})
            if len(got) != len(ref):
                raise ValueError(f'{path} has {len(got)} outputs, PyTorch gives {len(ref)}')
            for i, (r, o) in enumerate(zip(ref, got)):
                r = r.numpy()
                err = float(np.abs(r - o).max()) if r.shape == o.shape else None
                rows.append(dict(batch=b, hw=(h, w), output=i, shape=tuple(r.shape),
                                 onnx_shape=tuple(o.shape), max_abs_err=err))
    return rows


def check_rows(rows: List[dict], tolerance: float) -> Optional[str]:
    """A failure message for rows of another shape or above ``tolerance``, else None."""
    bad = []
    for r in rows:
        where = f'batch {r["batch"]}, {r["hw"][0]}x{r["hw"][1]}, output {r["output"]}'
        if r['max_abs_err'] is None:
            bad.append(f'{where}: ONNX shape {r["onnx_shape"]}, PyTorch {r["shape"]}')
        elif not r['max_abs_err'] <= tolerance:
            bad.append(f'{where}: max abs error {r["max_abs_err"]:.3g} > {tolerance:g}')
    if not bad:
        return None
    return ('ONNX verification failed (onnxruntime vs PyTorch):\n  ' + '\n  '.join(bad) +
            '\nThe exported graph does not compute what the model computes at these sizes.')


def format_rows(rows: List[dict]) -> str:
    lines = ['| batch | H x W | output | shape | max abs error |', '|---|---|---|---|---|']
    for r in rows:
        err = 'shape differs' if r['max_abs_err'] is None else f'{r["max_abs_err"]:.2e}'
        lines.append(f'| {r["batch"]} | {r["hw"][0]}x{r["hw"][1]} | {r["output"]} | '
                     f'{"x".join(map(str, r["shape"]))} | {err} |')
    return '\n'.join(lines)


def build_export_module(cfg, codebase: str, backbone_only: bool, checkpoint=None,
                        allow_unsafe: bool = False, with_argmax: bool = False):
    """The module to export and the model it comes from: the backbone, the segmentor in
    tensor mode (its label map with ``with_argmax``), or a two-stage detector's whole
    prediction path (:class:`~.detector.TwoStageDetectorGraph`)."""
    from ..analysis import build_model
    if with_argmax and (backbone_only or codebase != 'mmseg'):
        raise ValueError('--with-argmax is for whole mmseg segmentors (not with --backbone-only '
                         f'or an {codebase} config)')
    model = build_model(cfg)
    if checkpoint is not None:
        from mmengine.runner import load_checkpoint

        from ..weights import mmengine_checkpoint_loading
        with mmengine_checkpoint_loading(allow_unsafe):
            load_checkpoint(model, checkpoint, map_location='cpu')
    model.eval()
    if backbone_only:
        return model.backbone.eval(), model
    if codebase == 'mmdet':
        from .detector import detector_graph
        return detector_graph(model).eval(), model
    if with_argmax:
        return segmentor_labels(model).eval(), model
    return segmentor_tensor_mode(model).eval(), model


def onnx_session(path: str):
    """An onnxruntime CPU session of ``path``."""
    import onnxruntime as ort
    return ort.InferenceSession(path, providers=['CPUExecutionProvider'])


def random_inputs(shapes: Sequence[Tuple[int, int]], seed: int = 0, in_channels: int = 3):
    """One seeded normal [1, C, H, W] tensor per size (what normalised images look like)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, in_channels, h, w, generator=gen) for h, w in shapes]


def image_inputs(model, cfg, paths: Sequence[str]):
    """The config's test pipeline and the model's data preprocessor applied to each image:
    per file, the normalised, padded [1, 3, H, W] tensor (what ``tools/test.py`` feeds)
    and the (h, w) of the resized image inside it (``img_shape``)."""
    import torch
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    steps = [dict(step) for step in cfg.test_dataloader.dataset.pipeline
             if 'Annotations' not in step['type']]
    pipeline = Compose(steps)
    out = []
    with torch.no_grad():
        for path in paths:
            data = pipeline(dict(img_path=path, img_id=0))
            batch = model.data_preprocessor(
                dict(inputs=[data['inputs']], data_samples=[data['data_samples']]), False)
            out.append((batch['inputs'], tuple(batch['data_samples'][0].img_shape)))
    return out


def _image_and_size(item):
    """An item of :func:`random_inputs` (a tensor: the image is the whole input) or of
    :func:`image_inputs` (the tensor and the size of the image inside its padding)."""
    return item if isinstance(item, tuple) else (item, tuple(item.shape[2:]))


def verify_detector(model, path: str, inputs, iou: float = 0.99,
                    score_tol: float = 1e-3) -> List[dict]:
    """onnxruntime on ``path`` against mmdet's ``predict(rescale=False)`` on each item of
    ``inputs`` (a tensor, seen as the image; or a padded tensor and its image's size, as
    :func:`image_inputs` gives); one row per input with the counts of
    :func:`~.detector.match_detections` and, with masks, the share of equal mask pixels
    over the matched detections."""
    import numpy as np

    from .detector import TwoStageDetectorGraph, match_detections, torch_detections
    session = onnx_session(path)
    names = [o.name for o in session.get_outputs()]
    rows = []
    for item in inputs:
        x, img_hw = _image_and_size(item)
        ref = torch_detections(model, x, img_hw)
        feed = dict(zip(TwoStageDetectorGraph.input_names,
                        (x.numpy(), np.array(img_hw, np.int64))))
        got = dict(zip(names, session.run(None, feed)))
        row = match_detections(ref, got, iou, score_tol)
        row['hw'] = tuple(x.shape[2:])
        pairs = row.pop('pairs')
        if 'masks' in got and 'masks' in ref and pairs:
            equal = [np.mean(ref['masks'][i] == got['masks'][j]) for i, j in pairs]
            row['mask_equal'] = float(np.mean(equal))
        rows.append(row)
    return rows


def verify_segmentor_labels(model, path: str, inputs) -> List[dict]:
    """onnxruntime on ``path`` (``--with-argmax``: labels [B, H, W]) against mmseg's
    ``predict`` on each tensor of ``inputs`` (seen as the image); one row per input with
    the share of equal labels."""
    import numpy as np
    import torch
    from mmseg.structures import SegDataSample
    session = onnx_session(path)
    rows = []
    for item in inputs:
        x, _ = _image_and_size(item)  # the whole input seen as the image, padding included
        h, w = x.shape[2:]
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                             pad_shape=(h, w), padding_size=[0, 0, 0, 0]))
        with torch.no_grad():
            ref = model.predict(x, [sample])[0].pred_sem_seg.data[0].numpy()
        out = session.run(None, {INPUT_NAME: x.numpy()})[0]          # [1, H, W]
        equal = float(np.mean(ref == out[0])) if (1,) + ref.shape == out.shape else None
        rows.append(dict(hw=(h, w), shape=ref.shape, onnx_shape=out.shape, equal=equal))
    return rows


#: the key of the preprocessing record in the ONNX file's metadata_props
METADATA_KEY = 'mmplugin_inline'


def deployment_metadata(cfg, codebase: str, task: str, outputs: Sequence[str]) -> dict:
    """What a runtime without mmdet / mmseg needs to feed the graph and read its outputs
    (``tools/deployment/onnx_inference.py``), as ``{METADATA_KEY: JSON}``: the task and
    output names, the data preprocessor's mean, std, BGR -> RGB swap, size divisor and pad
    value, the test pipeline's ``Resize`` (scale, keep_ratio), the class names and, for a
    detector with ``mask_probs``, the mask head's ``mask_thr_binary``.

    Raises ValueError when the test pipeline resizes in a way this record cannot say.
    """
    import json
    pre = cfg.model.get('data_preprocessor', {})
    resize = None
    for step in cfg.test_dataloader.dataset.pipeline:
        kind = step['type'].split('.')[-1]
        if kind == 'Resize':
            scale = step.get('scale')
            if scale is None or step.get('scale_factor') is not None:
                raise ValueError(f'test pipeline Resize without a fixed scale: {step}')
            resize = dict(scale=list(scale), keep_ratio=bool(step.get('keep_ratio', False)))
        elif 'Resize' in kind or 'Crop' in kind or kind in ('Pad', 'MultiScaleFlipAug',
                                                            'TestTimeAug'):
            raise ValueError(f'the test pipeline step {kind} cannot be recorded for '
                             'onnx_inference.py (supported: Resize with a fixed scale)')
    if codebase == 'mmseg':  # SegDataPreProcessor pads test images only by its test_cfg
        test_pad = pre.get('test_cfg') or {}
        if test_pad.get('size'):
            raise ValueError(f'data_preprocessor.test_cfg.size {test_pad["size"]} (padding '
                             'to a fixed size) is not recorded')
        divisor, pad_value = test_pad.get('size_divisor') or 1, pre.get('pad_val', 0)
    else:
        divisor, pad_value = pre.get('pad_size_divisor') or 1, pre.get('pad_value', 0)
    record = dict(
        task=task, outputs=list(outputs), codebase=codebase,
        mean=[float(v) for v in pre.get('mean', [0, 0, 0])],
        std=[float(v) for v in pre.get('std', [1, 1, 1])],
        bgr_to_rgb=bool(pre.get('bgr_to_rgb', False)),
        size_divisor=int(divisor), pad_value=float(pad_value),
        resize=resize, classes=list(_class_names(cfg, codebase)))
    if 'mask_probs' in outputs:  # the runtime pastes them at the original size
        record['mask_thr_binary'] = float(cfg.model.test_cfg.rcnn.mask_thr_binary)
    return {METADATA_KEY: json.dumps(record)}


def _class_names(cfg, codebase: str) -> Sequence[str]:
    """The test dataset's class names (its metainfo, else its class's METAINFO)."""
    import importlib
    dataset = cfg.test_dataloader.dataset
    meta = dataset.get('metainfo') or {}
    if meta.get('classes'):
        return meta['classes']
    registry = importlib.import_module(f'{codebase}.registry').DATASETS
    cls = registry.get(dataset['type'])
    return getattr(cls, 'METAINFO', {}).get('classes', ()) if cls else ()
