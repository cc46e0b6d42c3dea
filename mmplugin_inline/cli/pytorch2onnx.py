"""Export an InLine backbone, or a whole mmseg segmentor in tensor mode, to ONNX.

Usage::

    python tools/deployment/pytorch2onnx.py CONFIG [--checkpoint CKPT] --out FILE
        --shape H W [--backbone-only] [--opset N] [--verify]
        [--verify-shapes H W [H W ...]] [--tolerance TOL] [--cfg-options KEY=VALUE ...]

The model is built from the config (random weights unless ``--checkpoint`` is given;
a whole-model checkpoint of ``tools/train.py``, read with the run-checkpoint policy of
``mmplugin_inline.weights``). ``--backbone-only`` exports ``model.backbone`` (mmdet or
mmseg configs); otherwise the config must be an mmseg segmentor, exported in tensor
mode: ``model(inputs, mode='tensor')``, normalised images [B, 3, H, W] in, the decode
head's logits [B, classes, H/4, W/4] out (the data preprocessor, resizing back to the
image and the argmax stay outside, as in mmseg's tensor mode).

``--verify`` runs the ONNX file with onnxruntime on the CPU against PyTorch at each
``--verify-shapes`` size (default: two sizes around ``--shape`` that are not multiples
of 32), with batch 1 and 2, and prints the max abs error per output; outputs of another
shape, or an error above ``--tolerance``, end the tool with status 1.
"""
import argparse
import os.path as osp

from ..deployment.onnx import (DEFAULT_OPSET, DEFAULT_TOLERANCE, EXAMPLE_BATCH,
                               build_export_module, check_rows, default_verify_shapes,
                               describe_range, export_onnx, format_rows, verify_onnx)


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
