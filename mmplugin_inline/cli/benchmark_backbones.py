"""Race the InLine backbones against the softmax backbones users would pick instead.

The paper's Fig. 3 on your machine: for every family (T presets) our backbone and its
softmax peer run alternately in one process (interleaved repeats, medians), at a
resolution sweep, in inference (no grad) and as a training step (forward, a loss over
all outputs, backward). Peers:

- pvt:   mmdet's ``PyramidVisionTransformer`` with PVT-T settings (depths 2-2-2-2,
         heads 1-2-5-8, spatial reduction 8-4-2-1);
- swin:  mmdet's ``SwinTransformer``, Swin-T (window 7);
- cswin: CSWin-T's softmax form from our own blocks (``block_types='SSSS'``:
         cross-shaped stripe attention in every stage);
- deit:  timm's ``vit_tiny_patch16_224`` (DeiT-T: 192 wide, 12 blocks, 3 heads; SDPA),
         built without weights and with a dynamic image size.

The Swin window sweep (``--windows``, at ``--window-size-input``) compares InLine in
windows (``inline_window``) with softmax windows, both in every stage of InLine-Swin-T's
layout; a window larger than a stage's map is cut to the map, as the authors' Swin does.

Measured per model and case: median time, peak extra memory (torch's profiler on CPU,
the allocator on CUDA: ``mmplugin_inline.analysis.peak_extra_memory``), forward FLOPs
from our counter (``mmplugin_inline.analysis.flop_analyzer``; multiply-accumulates, the
papers' convention; a training step is counted as 3x the forward), and the achieved
rate against a large fp32 matrix product (``--gemm-size``) timed in the same rounds:
how close to the hardware the model runs. A model whose previous size predicts a call
over ``--max-call-s`` or peak memory over ``--max-memory-gb`` is skipped at larger sizes,
with the reason in the table.

Writes ``results.json``, ``results.md`` and ``time_vs_pixels.png`` / ``memory_vs_pixels.png``
(log-log; the fitted slope of time against pixels is in the legend and the table) under
``--out-dir``. ``--with-cp none mlp attn full`` adds our backbones with those
``with_cp`` settings to the training-step races (the memory / time trade-off).

    python tools/analysis_tools/benchmark_backbones.py --out-dir work_dirs/bench_backbones
    python tools/analysis_tools/benchmark_backbones.py --families pvt --sizes 224x224 \\
        --repeats 1 --modes infer --device cuda          # one quick case
    python tools/analysis_tools/benchmark_backbones.py --paper-fig3 --device cuda

``--paper-fig3`` runs the paper's Fig. 3 instead: DeiT-T (timm) against InLine-DeiT-T at
input sides 224 to 1024 (640 and 1024 among them), Swin-T against InLine-Swin-T with
windows 7, 14, 28 and 56 at 224, inference throughput in images/s at ``--batch``, in fp32
and under fp16 autocast (on the CPU bf16 autocast stands in, as the table says), and
prints each measured ratio InLine / softmax beside the paper's (2.4x and 4.8x at 640 and
1024; 1.9x and 3.7x at windows 28 and 56; RTX 3090).
"""
import argparse

import torch

from ..analysis.backbone_benchmark import (
    CP_VALUES,
    FAMILIES,
    PRECISIONS,
    BackboneRaceOptions,
    run_benchmark,
    run_paper_fig3,
)
from ..analysis.backbone_report import MODES
from ..analysis.measure import parse_size


def parse_args(argv=None):
    defaults = BackboneRaceOptions()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--families', nargs='*', choices=FAMILIES, default=defaults.families,
                        help='families to race (none: only the window sweep)')
    parser.add_argument('--sizes', nargs='+', type=parse_size, default=defaults.sizes,
                        help='HxW inputs')
    parser.add_argument('--modes', nargs='+', choices=MODES, default=defaults.modes)
    parser.add_argument('--with-cp', nargs='+', choices=sorted(CP_VALUES),
                        default=defaults.with_cp,
                        help="also race our backbones with these with_cp settings in "
                             "training steps ('none' False, 'full' True)")
    parser.add_argument('--reference-paths', action='store_true',
                        help='also race our backbones on the reference paths (the code the '
                             'fast paths replaced; mmplugin_inline.core.reference_paths), '
                             'same weights, in the same rounds')
    parser.add_argument('--windows', nargs='*', type=int, default=defaults.windows,
                        help="Swin window sweep, e.g. 7 14 28 56 (none by default)")
    parser.add_argument('--window-size-input', type=parse_size,
                        default=defaults.window_size_input)
    parser.add_argument('--repeats', type=int, default=defaults.repeats)
    parser.add_argument('--device', default=defaults.device)
    parser.add_argument('--threads', type=int, default=defaults.threads,
                        help='CPU threads (torch)')
    parser.add_argument('--gemm-size', type=int, default=defaults.gemm_size)
    parser.add_argument('--max-call-s', type=float, default=defaults.max_call_s)
    parser.add_argument('--max-memory-gb', type=float, default=defaults.max_memory_gb)
    parser.add_argument('--no-memory', action='store_true', help='skip peak memory')
    parser.add_argument('--no-flops', action='store_true', help='skip FLOP counts')
    parser.add_argument('--no-plots', action='store_true')
    parser.add_argument('--out-dir', default=defaults.out_dir)
    fig3 = parser.add_argument_group(
        "the paper's Fig. 3 (--paper-fig3; the race's options above do not apply, except "
        '--device, --repeats, --threads, --max-call-s, --out-dir)')
    fig3.add_argument('--paper-fig3', action='store_true',
                      help='DeiT-T vs InLine-DeiT-T over --fig3-sizes, Swin-T vs InLine-Swin-T '
                           'over --fig3-windows; inference images/s; measured ratios beside '
                           "the paper's (2.4x, 4.8x at 640, 1024; 1.9x, 3.7x at windows 28, 56)")
    fig3.add_argument('--batch', type=int, default=defaults.batch,
                      help='images per call (default: 16 on CUDA, 1 on the CPU)')
    fig3.add_argument('--fig3-sizes', nargs='+', type=int, default=defaults.fig3_sizes,
                      help='DeiT input sides (default: %(default)s)')
    fig3.add_argument('--fig3-windows', nargs='+', type=int, default=defaults.fig3_windows,
                      help='Swin windows (default: %(default)s)')
    fig3.add_argument('--fig3-input', type=int, default=defaults.fig3_input,
                      help='side of the Swin window sweep input (default: %(default)s)')
    fig3.add_argument('--precisions', nargs='+', choices=sorted(PRECISIONS),
                      default=defaults.precisions,
                      help='default: fp32 and fp16 autocast on CUDA; fp32 and bf16 autocast '
                           'on the CPU (stated in the table)')
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error('--repeats must be at least 1')
    if args.batch is not None and args.batch < 1:
        parser.error('--batch must be at least 1')
    return args


def main(argv=None):
    options = BackboneRaceOptions(**vars(parse_args(argv)))
    if torch.device(options.device).type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit(f'--device {options.device} asked for, but CUDA is not available here')
    if options.paper_fig3:
        return run_paper_fig3(options)
    return run_benchmark(options)
