"""Benchmark InLine attention against the authors' formulation, linear and softmax attention.

For each token count N (a H x W map), head width d and head count, measures forward and
forward+backward time (median of interleaved repeats: the implementations alternate
inside one run so that a noisy machine affects them alike) and peak extra memory
(allocator peak over the inputs, from torch's profiler on CPU or the CUDA allocator).
Writes a JSON file and a log-log PNG plot, and prints a table of ratios to our kernel
and a linearity table: time at 4x the tokens over time at 1x (e.g. 256x256 / 128x128;
linear is 4), for every such pair of maps given, measured apart from the grid with the
two sizes alternating call by call (2x the repeats).

On CPU, glibc's malloc by default hands large blocks back to the system when they are
freed, so every call pays page faults to get zeroed pages again; that cost grows faster
than the tensors and is not the kernels'. ``--allocator keep`` (the default) keeps
freed memory mapped (see ``mmplugin_inline.analysis.keep_freed_memory``);
``--allocator default`` measures with glibc's defaults. Minor page faults per call are
recorded either way. With 4 KiB pages, large maps also pay TLB misses that small ones
do not; ``THP_MEM_ALLOC_ENABLE=1`` in the environment (torch reads it at start-up) puts
torch's large blocks on 2 MiB pages. Whether that took effect is recorded too.

    THP_MEM_ALLOC_ENABLE=1 python tools/analysis_tools/benchmark_attention.py \
        --out-dir work_dirs/bench_attn
    python tools/analysis_tools/benchmark_attention.py --quick   # a small smoke run
"""
import argparse
import dataclasses

from ..analysis.attention_benchmark import AttentionBenchmarkOptions, run_benchmark

#: ``--quick``: these values replace the grid's options (a small smoke run)
QUICK = dict(maps=['16x16', '32x32'], dims=[8], heads=[2], repeats=1)


def parse_args(argv=None):
    defaults = AttentionBenchmarkOptions()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--maps', nargs='+', default=defaults.maps, help='H x W token maps')
    parser.add_argument('--dims', type=int, nargs='+', default=defaults.dims)
    parser.add_argument('--heads', type=int, nargs='+', default=defaults.heads)
    parser.add_argument('--batch', type=int, default=defaults.batch)
    parser.add_argument('--repeats', type=int, default=defaults.repeats)
    parser.add_argument('--softmax-limit-gb', type=float, default=defaults.softmax_limit_gb,
                        help='skip naive softmax where its N x N tensors exceed this')
    parser.add_argument('--softmax-max-tokens', type=int, default=defaults.softmax_max_tokens,
                        help='skip softmax (quadratic time) above this many tokens')
    parser.add_argument('--device', default=defaults.device)
    parser.add_argument('--out-dir', default=defaults.out_dir)
    parser.add_argument('--threads', type=int, default=defaults.threads,
                        help='torch CPU threads (default: torch\'s choice); 1 is steadier on '
                             'a busy machine')
    parser.add_argument('--allocator', choices=['keep', 'default'], default=defaults.allocator,
                        help="CPU: 'keep' freed memory mapped (no page faults from glibc "
                             "returning it), or glibc's 'default' behaviour")
    parser.add_argument('--quick', action='store_true', help='tiny sizes, one repeat')
    return parser.parse_args(argv)


def benchmark_options(args: argparse.Namespace) -> AttentionBenchmarkOptions:
    """The parsed command line as :class:`AttentionBenchmarkOptions` (``--quick`` applied)."""
    values = vars(args).copy()
    quick = values.pop('quick')
    options = AttentionBenchmarkOptions(**values)
    return dataclasses.replace(options, **QUICK) if quick else options


def main(argv=None):
    return run_benchmark(benchmark_options(parse_args(argv)))
