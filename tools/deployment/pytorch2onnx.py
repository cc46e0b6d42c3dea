"""Export an InLine backbone, or a whole mmseg segmentor in tensor mode, to ONNX.

Usage::

    python tools/deployment/pytorch2onnx.py CONFIG [--checkpoint CKPT] --out FILE
        --shape H W [--backbone-only] [--opset N] [--verify]
        [--verify-shapes H W [H W ...]] [--tolerance TOL] [--cfg-options KEY=VALUE ...]

The model is built from the config (random weights unless ``--checkpoint`` is given;
a whole-model checkpoint of ``tools/train.py``, read with the run-checkpoint policy of
``mmplugin_inline.loading``). ``--backbone-only`` exports ``model.backbone`` (mmdet or
mmseg configs); otherwise the config must be an mmseg segmentor, exported in tensor
mode: ``model(inputs, mode='tensor')``, normalised images [B, 3, H, W] in, the decode
head's logits [B, classes, H/4, W/4] out (the data preprocessor, resizing back to the
image and the argmax stay outside, as in mmseg's tensor mode).

The export goes through torch's own exporter: ``torch.export`` with batch, height and
width left dynamic (``Dim.AUTO``), then ``torch.onnx.export`` of the exported program
(the dynamo-based path, torch's default). The TorchScript-based exporter
(``dynamo=False``) cannot export these models with a dynamic batch: the local residual
is one depthwise convolution with ``groups = B * C``, and it rejects a convolution
whose kernel shape is unknown. ONNX's ``Conv`` also needs ``group`` as a constant, so
that one convolution is decomposed, in the exported program only, into its 3x3 taps
(:func:`conv2d_dynamic_groups`); the eager model is not changed.

The example input has batch 2 (a batch of 1 would fix the batch size); the exported
program's ranges for batch, H and W are printed. A size that the model branches on
(Swin's shift is off in a stage whose map is no larger than the window) is a range
limit: export at a size like the ones you will run.

``--verify`` runs the ONNX file with onnxruntime on the CPU against PyTorch at each
``--verify-shapes`` size (default: two sizes around ``--shape`` that are not multiples
of 32), with batch 1 and 2, and prints the max abs error per output; outputs of another
shape, or an error above ``--tolerance``, end the tool with status 1.
"""
import argparse
import os
import os.path as osp
from typing import List, Optional, Sequence, Tuple

#: max abs error accepted by --verify (fp32; measured errors are ~1e-6, see README)
DEFAULT_TOLERANCE = 1e-4
DEFAULT_OPSET = 18
EXAMPLE_BATCH = 2


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
    from mmplugin_inline.core import depthwise_conv_taps
    if isinstance(groups, int):
        return NotImplemented
    if weight.shape[1] != 1 or tuple(stride) != (1, 1) or tuple(dilation) != (1, 1):
        raise NotImplementedError(
            'only depthwise, stride 1, dilation 1 convolutions with a size-dependent group '
            f'count can be exported; got weight {tuple(weight.shape)}, stride {stride}, '
            f'dilation {dilation}')
    out = depthwise_conv_taps(input, weight, padding)
    return out if bias is None else out + bias.view(1, -1, 1, 1)


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


def describe_range(name: str, r) -> str:
    if isinstance(r, int):
        return f'{name} fixed to {r}'
    low, high = r
    return f'{name} {low}..{"inf" if high is None else high}'


def export_onnx(module, shape: Tuple[int, int], out: str, opset: int = DEFAULT_OPSET,
                in_channels: int = 3) -> dict:
    """Export ``module`` (eval mode, one image tensor in) with dynamic batch, H and W.

    Returns ``dict(path, ranges=[batch, C, H, W] as (min, max) or a fixed int)``.
    Raises ValueError when the export fixed the batch, height or width.
    """
    import torch
    module.eval()
    example = torch.randn(EXAMPLE_BATCH, in_channels, *shape,
                          generator=torch.Generator().manual_seed(0))
    auto = torch.export.Dim.AUTO
    with torch.no_grad(), exportable_upsampling(module):
        exported = torch.export.export(module, (example,),
                                       dynamic_shapes=({0: auto, 2: auto, 3: auto},))
        exported = exported.run_decompositions(
            {torch.ops.aten.conv2d.default: conv2d_dynamic_groups})
    ranges = _dim_ranges(exported)
    fixed = [name for name, r in zip(('batch', None, 'height', 'width'), ranges)
             if name and isinstance(r, int)]
    if fixed:
        raise ValueError(
            f'the export fixed the {", ".join(fixed)} of the input to the example\'s '
            f'({", ".join(describe_range(n, r) for n, r in zip(("batch", "C", "H", "W"), ranges))}): '
            'the model branches on that size; export at another --shape, or see the '
            'limits in the README (Deployment: ONNX)')
    program = torch.onnx.export(exported, (example,), dynamo=True, opset_version=opset,
                                input_names=['inputs'], optimize=True, verbose=False)
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    program.save(out)
    return dict(path=out, ranges=ranges)


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
                        allow_unsafe: bool = False):
    """The module to export: the backbone, or the segmentor in tensor mode."""
    from mmplugin_inline.analysis import build_model
    if not backbone_only and codebase != 'mmseg':
        raise ValueError(f'whole-model export is for mmseg segmentors (tensor mode); this is an '
                         f'{codebase} config: add --backbone-only to export its backbone')
    model = build_model(cfg)
    if checkpoint is not None:
        from mmengine.runner import load_checkpoint

        from mmplugin_inline.loading import mmengine_checkpoint_loading
        with mmengine_checkpoint_loading(allow_unsafe):
            load_checkpoint(model, checkpoint, map_location='cpu')
    if backbone_only:
        return model.backbone.eval()
    return segmentor_tensor_mode(model).eval()


def parse_args(argv=None):
    from mmplugin_inline.tools_common import add_cfg_options
    parser = argparse.ArgumentParser(
        description='Export an InLine backbone or an mmseg segmentor (tensor mode) to ONNX '
                    'with dynamic batch, height and width')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--checkpoint', default=None,
                        help='whole-model checkpoint (default: random weights)')
    parser.add_argument('--allow-unsafe', action='store_true',
                        help='allow full unpickling of --checkpoint (only for files you trust)')
    parser.add_argument('--out', required=True, help='ONNX file to write')
    parser.add_argument('--shape', type=int, nargs='+', required=True, metavar='SIZE',
                        help='example input H W (or S for S x S)')
    parser.add_argument('--backbone-only', action='store_true',
                        help='export model.backbone (mmdet or mmseg configs)')
    parser.add_argument('--opset', type=int, default=DEFAULT_OPSET,
                        help=f'ONNX opset (default {DEFAULT_OPSET})')
    parser.add_argument('--verify', action='store_true',
                        help='compare onnxruntime with PyTorch at --verify-shapes')
    parser.add_argument('--verify-shapes', type=int, nargs='+', default=None, metavar='SIZE',
                        help='H W pairs to verify at (default: two sizes around --shape, '
                             'not multiples of 32)')
    parser.add_argument('--tolerance', type=float, default=DEFAULT_TOLERANCE,
                        help=f'max abs error accepted by --verify (default {DEFAULT_TOLERANCE:g})')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def main(argv=None):
    from mmplugin_inline.analysis import parse_shape
    from mmplugin_inline.utils.env_check import assert_environment
    from mmplugin_inline.tools_common import fail, load_tool_config
    assert_environment()
    args = parse_args(argv)
    try:
        shape = parse_shape(args.shape)
    except ValueError as exc:
        fail(str(exc))
    verify_shapes = None
    if args.verify_shapes is not None:
        if len(args.verify_shapes) % 2:
            fail(f'--verify-shapes takes H W pairs, got {len(args.verify_shapes)} numbers: '
                 f'{args.verify_shapes}')
        verify_shapes = list(zip(args.verify_shapes[::2], args.verify_shapes[1::2]))
        if min(args.verify_shapes) < 1:
            fail(f'--verify-shapes sizes must be positive, got {args.verify_shapes}')
    if args.checkpoint is not None and not osp.isfile(args.checkpoint):
        fail(f'Checkpoint not found: {args.checkpoint}')
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
        if args.verify:
            import onnxruntime  # noqa: F401
    except ImportError as exc:
        fail(f'{exc}: the ONNX export needs onnx, onnxscript (and onnxruntime for --verify); '
             'install the versions pinned in requirements/pinned.txt (make setup)')
    cfg, codebase = load_tool_config(args.config, args.cfg_options)
    try:
        module = build_export_module(cfg, codebase, args.backbone_only, args.checkpoint,
                                     args.allow_unsafe)
    except ValueError as exc:
        fail(str(exc))
    what = 'backbone' if args.backbone_only else 'segmentor (tensor mode)'
    print(f'Exporting the {what} of {args.config} at {shape[0]}x{shape[1]} '
          f'(batch {EXAMPLE_BATCH}), opset {args.opset} ...', flush=True)
    try:
        result = export_onnx(module, shape, args.out, args.opset)
    except ValueError as exc:
        fail(f'ONNX export failed: {exc}')
    names = ('batch', 'channels', 'H', 'W')
    print(f'Wrote {args.out}; dynamic input: ' +
          ', '.join(describe_range(n, r) for n, r in zip(names, result['ranges'])) +
          " (torch.export's ranges start at 2; --verify checks batch 1 too)")
    if not args.verify:
        return 0
    shapes = verify_shapes or default_verify_shapes(shape)
    rows = verify_onnx(module, args.out, shapes)
    print('onnxruntime (CPU) vs PyTorch:')
    print(format_rows(rows))
    message = check_rows(rows, args.tolerance)
    if message:
        fail(message)
    worst = max(r['max_abs_err'] for r in rows)
    print(f'Verified at {", ".join(f"{h}x{w}" for h, w in shapes)} (batch 1 and '
          f'{EXAMPLE_BATCH}): max abs error {worst:.2e} <= {args.tolerance:g}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
