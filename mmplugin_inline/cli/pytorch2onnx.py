"""Export an InLine backbone, a whole mmseg segmentor or a whole mmdet two-stage detector
to ONNX.

Usage::

    python tools/deployment/pytorch2onnx.py CONFIG [--checkpoint CKPT] --out FILE
        --shape H W [--backbone-only | --with-argmax] [--opset N] [--verify]
        [--verify-shapes H W [H W ...]] [--verify-images DIR] [--tolerance TOL]
        [--min-share S] [--cfg-options KEY=VALUE ...]

The model is built from the config (random weights unless ``--checkpoint`` is given;
a whole-model checkpoint of ``tools/train.py``, read with the run-checkpoint policy of
``mmplugin_inline.weights``). What is exported:

- ``--backbone-only``: ``model.backbone`` (mmdet or mmseg configs), batch, H, W dynamic;
- an mmseg segmentor: its tensor mode, normalised images [B, 3, H, W] in, the decode
  head's logits [B, classes, H/4, W/4] out; with ``--with-argmax`` the label map
  ``labels`` [B, H, W] int64 (resized to the input and argmax inside the graph);
- an mmdet two-stage detector (Mask R-CNN, Cascade Mask R-CNN): the whole prediction
  path on one normalised image [1, 3, H, W] (H, W dynamic), out ``boxes`` [N, 4],
  ``scores`` [N], ``labels`` [N] and, with a mask head, ``masks`` [N, H, W] bool
  (:mod:`mmplugin_inline.deployment.detector`).

Whole models carry what ``tools/deployment/onnx_inference.py`` needs (the test-time
resize, normalisation, padding and the class names) in the file's metadata.

``--verify`` runs the ONNX file with onnxruntime on the CPU against PyTorch. Backbones and
logits: at each ``--verify-shapes`` size (default: two sizes around ``--shape`` that are
not multiples of 32) with batch 1 and 2, the max abs error per output; outputs of another
shape, or an error above ``--tolerance``, end the tool with status 1. Whole detectors and
label maps: against the model's ``predict`` (``rescale=False``) on the same tensors,
random ones at ``--verify-shapes`` or the images of ``--verify-images`` through the
config's test pipeline; detections match with the same label, box IoU >= 0.99 and score
within 1e-3, labels are compared pixel by pixel; a matched (equal) share below
``--min-share`` ends the tool with status 1.
"""
import argparse
import os.path as osp

from ..deployment.build import build_export_module
from ..deployment.onnx import (
    DEFAULT_OPSET,
    DEFAULT_TOLERANCE,
    EXAMPLE_BATCH,
    describe_range,
    export_onnx,
    onnx_operators,
)
from ..deployment.verify import check_rows, default_verify_shapes, format_rows, verify_onnx

#: the least share of matched detections (of equal labels) --verify accepts by default
DEFAULT_MIN_SHARE = {'detector': 0.99, 'labels': 0.999}
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def parse_args(argv=None):
    from mmplugin_inline.tools_common import add_cfg_options
    parser = argparse.ArgumentParser(
        description='Export an InLine backbone, a whole mmseg segmentor or a whole mmdet '
                    'two-stage detector to ONNX with dynamic height and width')
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
    parser.add_argument('--with-argmax', action='store_true',
                        help='segmentors: resize to the input and argmax in the graph '
                             '(labels [B, H, W] int64 instead of logits)')
    parser.add_argument('--opset', type=int, default=DEFAULT_OPSET,
                        help=f'ONNX opset (default {DEFAULT_OPSET})')
    parser.add_argument('--verify', action='store_true',
                        help='compare onnxruntime with PyTorch at --verify-shapes')
    parser.add_argument('--verify-shapes', type=int, nargs='+', default=None, metavar='SIZE',
                        help='H W pairs to verify at (default: two sizes around --shape, '
                             'not multiples of 32)')
    parser.add_argument('--verify-images', default=None, metavar='DIR',
                        help='whole models: verify on these images (the config\'s test '
                             'pipeline) instead of random inputs')
    parser.add_argument('--min-share', type=float, default=None,
                        help='whole models: least share of matched detections (default '
                             f'{DEFAULT_MIN_SHARE["detector"]}) or of equal labels (default '
                             f'{DEFAULT_MIN_SHARE["labels"]}) --verify accepts')
    parser.add_argument('--tolerance', type=float, default=DEFAULT_TOLERANCE,
                        help=f'max abs error accepted by --verify (default {DEFAULT_TOLERANCE:g})')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def _image_files(directory: str):
    """The image files of ``directory``, sorted; a message ends the tool if none."""
    import os

    from mmplugin_inline.tools_common import fail
    if not osp.isdir(directory):
        fail(f'--verify-images: not a folder: {directory}')
    files = sorted(osp.join(directory, f) for f in os.listdir(directory)
                   if f.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
        fail(f'--verify-images: no images ({", ".join(IMAGE_EXTENSIONS)}) in {directory}')
    return files


def _kind(args, codebase: str) -> str:
    if args.backbone_only:
        return 'backbone'
    if codebase == 'mmdet':
        return 'detector'
    return 'labels' if args.with_argmax else 'logits'


WHAT = dict(backbone='backbone', logits='segmentor (tensor mode)',
            labels='segmentor (label map)', detector='whole detector')


def main(argv=None):
    from mmplugin_inline.analysis import parse_shape
    from mmplugin_inline.tools_common import fail, load_tool_config
    from mmplugin_inline.utils.env_check import assert_environment
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
    if args.min_share is not None and not 0 <= args.min_share <= 1:
        fail(f'--min-share must be between 0 and 1, got {args.min_share}')
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
    kind = _kind(args, codebase)
    if args.verify_images is not None and kind in ('backbone', 'logits'):
        fail('--verify-images is for whole detectors and --with-argmax segmentors')
    images = _image_files(args.verify_images) if args.verify_images else None
    try:
        module, model = build_export_module(cfg, codebase, args.backbone_only, args.checkpoint,
                                            args.allow_unsafe, args.with_argmax)
    except ValueError as exc:
        fail(str(exc))
    batch = 1 if kind == 'detector' else EXAMPLE_BATCH
    outputs = (module.output_names if kind == 'detector' else
               ['labels'] if kind == 'labels' else None)
    metadata = None
    if kind != 'backbone':
        from ..deployment.metadata import deployment_metadata
        task = 'detection' if kind == 'detector' else 'segmentation'
        try:
            metadata = deployment_metadata(cfg, codebase, task, outputs or ['logits'])
        except ValueError as exc:
            print(f'Not recording the preprocessing for onnx_inference.py: {exc}')
    print(f'Exporting the {WHAT[kind]} of {args.config} at {shape[0]}x{shape[1]} '
          f'(batch {batch}), opset {args.opset} ...', flush=True)
    try:
        result = export_onnx(module, shape, args.out, args.opset, batch=batch,
                             output_names=outputs, metadata=metadata)
    except ValueError as exc:
        fail(f'ONNX export failed: {exc}')
    names = ('batch', 'channels', 'H', 'W')
    print(f'Wrote {args.out} in {result["seconds"]:.1f} s; dynamic input: ' +
          ', '.join(describe_range(n, r) for n, r in zip(names, result['ranges'])) +
          (" (torch.export's ranges start at 2; --verify checks batch 1 too)"
           if batch != 1 else ''))
    if outputs:
        print(f'Outputs: {", ".join(outputs)}')
    print(f'Operators: {", ".join(onnx_operators(args.out))}')
    if not args.verify:
        return 0
    shapes = verify_shapes or default_verify_shapes(shape)
    if kind in ('detector', 'labels'):
        return _verify_whole(kind, model, cfg, args, shapes, images)
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


def _verify_whole(kind, model, cfg, args, shapes, images):
    """--verify of a whole detector or label map against the model's predict."""
    from mmplugin_inline.tools_common import fail

    from ..deployment.verify import (
        image_inputs,
        random_inputs,
        verify_detector,
        verify_segmentor_labels,
    )
    inputs = image_inputs(model, cfg, images) if images else random_inputs(shapes)
    names = [osp.basename(p) for p in images] if images else \
        [f'random {h}x{w}' for h, w in shapes]
    min_share = args.min_share if args.min_share is not None else DEFAULT_MIN_SHARE[kind]
    print(f'onnxruntime (CPU) vs PyTorch predict (rescale=False), {len(inputs)} input(s):')
    if kind == 'detector':
        rows = verify_detector(model, args.out, inputs)
        print('| input | H x W | PyTorch | ONNX | matched | share | equal mask pixels |')
        print('|---|---|---|---|---|---|---|')
        for name, r in zip(names, rows):
            mask = f'{r["mask_equal"]:.5f}' if 'mask_equal' in r else '-'
            print(f'| {name} | {r["hw"][0]}x{r["hw"][1]} | {r["ref"]} | {r["got"]} | '
                  f'{r["matched"]} | {r["share"]:.4f} | {mask} |')
        total = sum(max(r['ref'], r['got']) for r in rows)
        if total == 0:
            fail('Nothing to compare: neither PyTorch nor ONNX detects anything on these '
                 'inputs; verify on images (--verify-images) with a trained --checkpoint')
        share = sum(r['matched'] for r in rows) / total
        what = (f'matched detections {share:.4f} (same label, box IoU >= 0.99, score within '
                '1e-3)')
    else:
        rows = verify_segmentor_labels(model, args.out, inputs)
        print('| input | H x W | labels | equal labels |')
        print('|---|---|---|---|')
        for name, r in zip(names, rows):
            equal = 'shape differs' if r['equal'] is None else f'{r["equal"]:.5f}'
            print(f'| {name} | {r["hw"][0]}x{r["hw"][1]} | '
                  f'{"x".join(map(str, r["onnx_shape"]))} | {equal} |')
        if any(r['equal'] is None for r in rows):
            fail('ONNX verification failed: the label map has another shape than PyTorch\'s')
        pixels = [r['hw'][0] * r['hw'][1] for r in rows]
        share = sum(r['equal'] * n for r, n in zip(rows, pixels)) / sum(pixels)
        what = f'equal labels {share:.5f}'
    if share < min_share:
        fail(f'ONNX verification failed: {what} < {min_share:g}')
    print(f'Verified: {what} >= {min_share:g}')
    return 0
