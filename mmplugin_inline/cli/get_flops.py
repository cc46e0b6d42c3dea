"""Parameters and FLOPs of an mmdet / mmseg model and of its backbone.

Usage::

    python tools/analysis_tools/get_flops.py CONFIG --shape H W [--backbone-only]
        [--breakdown [DEPTH]] [--device cpu|cuda] [--cfg-options KEY=VALUE ...]

The model is built from the config with random weights and traced by mmengine's
``FlopAnalyzer`` on one dummy image of H x W, passed through the model's data
preprocessor (which may pad it, e.g. to a multiple of 32: the padded shape is
printed). Detectors and segmentors run their tensor forward (``mode='tensor'``: the
backbone, neck and heads; for two-stage detectors the RPN proposals feed the RoI
heads), as mmdet's and mmseg's own get_flops do; the two-stage figure therefore
depends on how many proposals the RPN keeps (up to 1000 with random weights, as with
trained ones). The backbone row comes from the same trace. Handlers for softmax
attention (``scaled_dot_product_attention``), ``baddbmm`` and custom autograd
Functions (counted from the ops traced inside them: the InLine kernel's
``Kc^T Vc`` matmul of the centred keys and values and the ``bmm`` of ``Q @ M``,
its mean row added in place) are added to mmengine's (see
``mmplugin_inline.analysis.complexity``); any op still not counted is printed as a
warning.

FLOPs here are multiply-accumulates: one fused multiply-add counts as one, the
convention of mmengine / fvcore and of the tables of the InLine, Swin and PVT papers.
"""
import argparse

from ..analysis.flops import format_report, get_flops
from ..utils.env_check import assert_environment


def parse_args(argv=None):
    from mmplugin_inline.tools_common import add_model_options
    parser = argparse.ArgumentParser(
        description='Params and FLOPs (MACs) of an mmdet / mmseg model and its backbone')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--backbone-only', action='store_true',
                        help='trace only the backbone (faster)')
    parser.add_argument('--breakdown', type=int, nargs='?', const=3, default=None,
                        metavar='DEPTH', help='also print the per-module table to DEPTH '
                        '(default 3) levels')
    add_model_options(parser)
    return parser.parse_args(argv)


def main(argv=None):
    assert_environment()
    from mmplugin_inline.tools_common import load_tool_config
    args = parse_args(argv)
    cfg, _ = load_tool_config(args.config, args.cfg_options)
    result = get_flops(cfg, args.shape, backbone_only=args.backbone_only, device=args.device)
    print(format_report(result, args.config))
    if args.breakdown is not None:
        from mmplugin_inline.analysis import module_table
        print(module_table(result['analyzer'], args.breakdown))
