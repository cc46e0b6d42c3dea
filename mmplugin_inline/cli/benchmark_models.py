"""Race whole models: our configs' detectors / segmentors against the softmax models a
user would otherwise train, interleaved in one process, for high-resolution users.

Pairs (``--pairs``; both models of a pair share everything but the backbone, random
weights, nothing downloaded):

- upernet-swin:  UperNet InLine-Swin-T vs UperNet Swin-T (mmseg's Swin-T, window 7);
- fpn-pvt:       Semantic FPN InLine-PVT-T vs Semantic FPN PVT-T (mmdet's PVT-T);
- mask-rcnn-pvt: Mask R-CNN InLine-PVT-T vs Mask R-CNN PVT-T (mmdet's PVT-T).

Cases: inference (batch 1, data preprocessor + ``test_step``, predict mode) at each of
``--sizes``; the segmentors also in mmseg's ``slide`` mode (``--slide-crop`` crops at
``--slide-stride``) where the image is larger than a crop; a training step (forward
with losses + backward, ``--train-batch`` images with ground truth) at ``--train-size``.
Random weights leave a detector few boxes, and not as many for both models;
``--detections N`` makes both keep N per image (score threshold 0), so that the mask
head and the pasting of masks do the same, realistic work.
Reported per case: median seconds per image of each model, the speed-up peer / ours,
peak extra memory, and for the segmentors whole against slide. Writes
``results.json`` and ``results.md`` under ``--out-dir``. The race is
``mmplugin_inline.analysis.model_race``.

    python tools/analysis_tools/benchmark_models.py --threads 2 --detections 100 \\
        --out-dir work_dirs/benchmark_models                      # the full race
    python tools/analysis_tools/benchmark_models.py --pairs fpn-pvt --sizes 512x512 \\
        --no-train --repeats 1                                    # one quick case
"""
import argparse
from typing import Optional

from ..analysis.measure import parse_size
from ..analysis.model_race import DEFAULT_SIZES, PAIRS, ModelRaceOptions


def add_race_options(parser) -> None:
    """The options of ``tools/analysis_tools/benchmark_models.py`` (the script makes the
    parser, as mmdet's tools do); check the parsed values with :func:`check_race_args`,
    turn them into the race's options with :func:`race_options`."""
    defaults = ModelRaceOptions()
    parser.add_argument('--pairs', nargs='+', choices=sorted(PAIRS), default=defaults.pairs,
                        help='pairs to race (default: all)')
    parser.add_argument('--sizes', nargs='+', type=parse_size, metavar='HxW',
                        default=defaults.sizes,
                        help=f'inference sizes (default: {" ".join(DEFAULT_SIZES)})')
    parser.add_argument('--train-size', type=parse_size, default=defaults.train_size,
                        metavar='HxW',
                        help='training-step size (default: 512x512)')
    parser.add_argument('--no-train', action='store_true', help='no training step')
    parser.add_argument('--train-batch', type=int, default=defaults.train_batch, metavar='N',
                        help="images per training step (default: 2; UperNet's pooling "
                             'branch ends in a 1x1 map, which BatchNorm cannot train on '
                             'with one image)')
    parser.add_argument('--slide-crop', type=parse_size, default=defaults.slide_crop,
                        metavar='HxW',
                        help="segmentors' slide-mode crop (default: 1024x1024)")
    parser.add_argument('--slide-stride', type=parse_size, default=defaults.slide_stride,
                        metavar='HxW',
                        help="segmentors' slide-mode stride (default: 768x768)")
    parser.add_argument('--detections', type=int, default=defaults.detections, metavar='N',
                        help='detectors keep N detections per image (score threshold 0; '
                             'there are always enough), so that both models post-process '
                             'the same; '
                             "default: the config's test_cfg (random weights: few boxes)")
    parser.add_argument('--repeats', type=int, default=defaults.repeats,
                        help='timed rounds per case (default: 2)')
    parser.add_argument('--warmup', type=int, default=defaults.warmup,
                        help='warm-up rounds per case (default: 1)')
    parser.add_argument('--threads', type=int, default=defaults.threads,
                        help='CPU threads (torch)')
    parser.add_argument('--device', default=defaults.device, help='cpu or cuda (cuda:N)')
    parser.add_argument('--max-call-s', type=float, default=defaults.max_call_s,
                        help='skip a case whose call is predicted (from the smaller sizes) '
                             'to take longer; time a call whose warm-up took longer only '
                             'once (default: 600)')
    parser.add_argument('--no-memory', action='store_true', help='skip peak memory')
    parser.add_argument('--out-dir', default=defaults.out_dir)


def race_options(args) -> ModelRaceOptions:
    """The parsed options of :func:`add_race_options` as the race's :class:`ModelRaceOptions`."""
    return ModelRaceOptions(**vars(args))


def check_race_args(args) -> Optional[str]:
    """What is wrong with parsed options (a message for ``parser.error``), or None."""
    if args.repeats < 1:
        return '--repeats must be at least 1'
    if args.warmup < 1:
        return '--warmup must be at least 1 (the first call of a model is not timed)'
    if args.train_batch < 1:
        return '--train-batch must be at least 1'
    if args.threads is not None and args.threads < 1:
        return '--threads must be at least 1'
    if args.detections is not None and args.detections < 1:
        return '--detections must be at least 1'
    if args.max_call_s <= 0:
        return '--max-call-s must be positive'
    return None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_race_options(parser)
    args = parser.parse_args(argv)
    error = check_race_args(args)
    if error:
        parser.error(error)
    return args


def main(argv=None):
    from ..utils.env_check import assert_environment
    assert_environment()
    args = parse_args(argv)
    import torch

    from ..analysis.measure import keep_freed_memory
    from ..analysis.model_race import run_race
    from ..tools_common import fail
    if torch.device(args.device).type == 'cuda' and not torch.cuda.is_available():
        fail(f'--device {args.device} asked for, but CUDA is not available here')
    if torch.device(args.device).type == 'cpu':
        keep_freed_memory()  # as the backbone race: no page faults for re-used memory
    out = run_race(race_options(args))
    print(out['table'])
    print('wrote', ' and '.join(f'{args.out_dir}/{n}' for n in ('results.json', 'results.md')))
    return out

