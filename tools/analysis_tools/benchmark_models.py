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
``results.json`` and ``results.md`` under ``--out-dir``. The logic is
``mmplugin_inline.analysis.model_race``.

    python tools/analysis_tools/benchmark_models.py --threads 2 --detections 100 \\
        --out-dir work_dirs/benchmark_models                      # the full race
    python tools/analysis_tools/benchmark_models.py --pairs fpn-pvt --sizes 512x512 \\
        --no-train --repeats 1                                    # one quick case
"""
import argparse


def parse_args(argv=None):
    from mmplugin_inline.analysis.model_race import add_race_options, check_race_args
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_race_options(parser)
    args = parser.parse_args(argv)
    error = check_race_args(args)
    if error:
        parser.error(error)
    return args


def main(argv=None):
    from mmplugin_inline.utils.env_check import assert_environment
    assert_environment()
    args = parse_args(argv)
    import torch

    from mmplugin_inline.analysis.measure import keep_freed_memory
    from mmplugin_inline.analysis.model_race import run_race
    from mmplugin_inline.tools_common import fail
    if torch.device(args.device).type == 'cuda' and not torch.cuda.is_available():
        fail(f'--device {args.device} asked for, but CUDA is not available here')
    if torch.device(args.device).type == 'cpu':
        keep_freed_memory()  # as the backbone race: no page faults for re-used memory
    out = run_race(args)
    print(out['table'])
    print('wrote', ' and '.join(f'{args.out_dir}/{n}' for n in ('results.json', 'results.md')))
    return out


if __name__ == '__main__':
    main()
