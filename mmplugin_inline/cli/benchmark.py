"""Inference speed (images/s) and peak memory of an mmdet / mmseg model.

Usage::

    python tools/analysis_tools/benchmark.py CONFIG [--shape H W] [--batch N]
        [--warmup W] [--iters I] [--device cpu|cuda] [--mode predict|tensor]
        [--cfg-options KEY=VALUE ...]

The model is built from the config with random weights (no checkpoint is read; speed
does not depend on the weights, though a detector's post-processing does a little on
how many boxes survive). Each iteration runs ``model.test_step`` on a batch of N
random H x W images, as a test loop does: the data preprocessor (normalise, pad),
then the forward in ``--mode``: 'predict' (default; with post-processing: NMS,
mask pasting, resizing to the image) or 'tensor' (the network only). W untimed
warm-up iterations come first; images/s = N * I / total time of the I timed ones.

Peak memory: what tensors allocated during one more (untimed) iteration occupy at
once beyond what was allocated before it (the weights), from the CUDA allocator on
GPU and from torch's profiler (``profile_memory``, per-op allocations and frees
replayed in order) on CPU; the weights' size is printed beside it.
"""
import argparse

from ..analysis.model_benchmark import MODES, benchmark, format_report
from ..utils.env_check import assert_environment


def parse_args(argv=None):
    from mmplugin_inline.tools_common import add_model_options
    parser = argparse.ArgumentParser(
        description='Inference images/s and peak memory of an mmdet / mmseg model')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--batch', type=int, default=1, help='images per iteration')
    parser.add_argument('--warmup', type=int, default=5, help='untimed iterations first')
    parser.add_argument('--iters', type=int, default=20, help='timed iterations')
    parser.add_argument('--mode', choices=MODES, default='predict',
                        help="'predict': with post-processing (default); 'tensor': network only")
    add_model_options(parser)
    return parser.parse_args(argv)


def main(argv=None):
    assert_environment()
    from mmplugin_inline.tools_common import load_tool_config
    args = parse_args(argv)
    cfg, _ = load_tool_config(args.config, args.cfg_options)
    result = benchmark(cfg, args.shape, args.batch, args.warmup, args.iters, args.device,
                       args.mode)
    print(format_report(result, args.config))
    return result
