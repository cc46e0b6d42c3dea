"""Train one config in several attention variants, several seeds each, and compare them.

The paper's comparison in miniature: the same backbone with softmax ('S'), plain linear
attention ('L'), InLine without its local residual ('I' + ``-nores``) and InLine ('I'),
each trained for the same number of iterations from the same config (its time budget
removed), validated at the end; the table gives the metric's mean ± standard deviation
over the seeds, its range and the time per iteration, and says for every pair whether
the difference exceeds the seeds' spread (ranges apart) or is inconclusive.

    python tools/analysis_tools/compare_mixers.py configs/demo/fpn_inline-pvt-t_shapes-demo.py \\
        --variants SSSS LLLL IIII-nores IIII --seeds 0 1 --iters 300 \\
        --out-dir work_dirs/compare_mixers
"""
import argparse
import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')


def parse_args(argv=None):
    from mmplugin_inline import tools_common
    from mmplugin_inline.analysis.mixer_comparison import Variant
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='a training config with an IterBasedTrainLoop')
    parser.add_argument('--variants', nargs='+', type=Variant.parse,
                        default=[Variant.parse(v) for v in ('SSSS', 'LLLL', 'IIII-nores',
                                                            'IIII')],
                        help="block types per variant; '-nores' builds the linear blocks "
                             "without their local residual (default: SSSS LLLL IIII-nores "
                             "IIII)")
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1])
    parser.add_argument('--iters', type=int, default=300, help='training iterations per run')
    parser.add_argument('--metric', help="validation metric (default: mIoU for mmseg, "
                                         "coco/bbox_mAP for mmdet)")
    parser.add_argument('--out-dir', default='work_dirs/compare_mixers')
    tools_common.add_cfg_options(parser)
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error('--iters must be at least 1')
    return args


def main(argv=None):
    from mmplugin_inline.utils.env_check import assert_environment
    assert_environment()
    args = parse_args(argv)
    from mmplugin_inline.analysis.mixer_comparison import compare
    return compare(args.config, args.variants, args.seeds, args.iters, args.out_dir,
                   args.cfg_options, args.metric)
