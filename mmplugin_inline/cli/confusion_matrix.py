"""Confusion matrix of a config's test set from the predictions ``tools/test.py --out`` saved.

Usage::

    python tools/test.py CONFIG CHECKPOINT --out preds.pkl          # mmdet
    python tools/analysis_tools/confusion_matrix.py CONFIG preds.pkl SAVE_DIR
        [--score-thr 0.3] [--tp-iou-thr 0.5] [--nms-iou-thr T]

    python tools/test.py CONFIG CHECKPOINT --out preds/             # mmseg: label maps
    python tools/analysis_tools/confusion_matrix.py CONFIG preds/ SAVE_DIR

    common: [--show] [--color-theme NAME] [--title T] [--cfg-options KEY=VALUE ...]

Writes ``SAVE_DIR/confusion_matrix.png`` (rows: ground truth, columns: prediction, each
row normalised to 100 %) and prints the counts. The counting and the figure are mmdet's
(``calculate_confusion_matrix``: boxes matched at ``--tp-iou-thr``, detections under
``--score-thr`` dropped, a last 'background' row and column for false positives and
missed objects) or mmseg's (``plot_confusion_matrix``), from the scripts the installed
codebases ship; the plugin is imported first (the config's ``custom_imports``).

Not taken from mmseg's script: its counting. It subtracts 1 from ground truth that the
pipeline's ``LoadAnnotations`` has already reduced, compares it with label maps that
``IoUMetric`` wrote back in the dataset's own numbering (+1 under ``reduce_zero_label``),
reads the class names from the dataset class (empty for ``BaseSegDataset`` with
``metainfo``) and pairs files by sorted name. Here each image's label map is found by
name, both maps are compared in the reduced numbering, ignored pixels skipped. Without a
display ``--show`` says so and only writes the file.

The .pkl is unpickled in full, as by mmdet's script (its tensors are pickled through
``torch.storage._load_from_bytes``, which the data-only reader of ``mmplugin_inline.weights`` sets
aside): give it only predictions you made.
"""
import argparse
import os
import os.path as osp

import numpy as np

from mmplugin_inline.utils.env_check import assert_environment


def parse_args(argv=None):
    from mmplugin_inline.tools_common import add_cfg_options
    parser = argparse.ArgumentParser(description='Confusion matrix from saved test predictions')
    parser.add_argument('config', help='the mmdet or mmseg config the predictions were made with')
    parser.add_argument('prediction_path',
                        help='mmdet: the .pkl of tools/test.py --out; mmseg: the folder of '
                             'label maps of tools/test.py --out')
    parser.add_argument('save_dir', help='confusion_matrix.png goes there')
    parser.add_argument('--show', action='store_true', help='also show the figure')
    parser.add_argument('--color-theme', default=None,
                        help='matplotlib colour map (default: plasma for mmdet, OrRd for mmseg)')
    parser.add_argument('--title', default='Normalized Confusion Matrix')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='mmdet: detections scored lower are dropped')
    parser.add_argument('--tp-iou-thr', type=float, default=0.5,
                        help='mmdet: IoU at which a detection matches a ground-truth box')
    parser.add_argument('--nms-iou-thr', type=float, default=None,
                        help='mmdet: run NMS again at this IoU (default: as predicted)')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def _test_dataset(cfg, codebase):
    from mmengine.registry import init_default_scope
    init_default_scope(codebase)
    from importlib import import_module
    return import_module(f'{codebase}.registry').DATASETS.build(cfg.test_dataloader.dataset)


def detection_matrix(script, cfg, path, args):
    """mmdet's counts for the predictions in the .pkl at ``path``."""
    from mmengine.fileio import load

    from mmplugin_inline.tools_common import fail
    if not osp.isfile(path) or not path.endswith(('.pkl', '.pickle')):
        fail(f'Predictions not found: {path}. For mmdet configs give the .pkl that '
             'tools/test.py CONFIG CHECKPOINT --out preds.pkl writes.')
    results = load(path)
    dataset = _test_dataset(cfg, 'mmdet')
    if not isinstance(results, list) or len(results) != len(dataset) or not all(
            isinstance(r, dict) and 'pred_instances' in r for r in results):
        fail(f'{path} does not hold one detection result per image of the test set '
             f'({len(dataset)} images): were the predictions made with this config\'s '
             'test_dataloader?')
    matrix = script.calculate_confusion_matrix(dataset, results, args.score_thr,
                                               args.nms_iou_thr, args.tp_iou_thr)
    return matrix, tuple(dataset.metainfo['classes']) + ('background',)


def segmentation_matrix(cfg, path):
    """Counts of (ground truth, predicted) pixel labels over the test set."""
    from PIL import Image

    from mmplugin_inline.tools_common import fail
    if not osp.isdir(path):
        fail(f'Predictions not found: {path}. For mmseg configs give the folder of label maps '
             'that tools/test.py CONFIG CHECKPOINT --out DIR writes.')
    dataset = _test_dataset(cfg, 'mmseg')
    classes = tuple(dataset.metainfo['classes'])
    n = len(classes)
    matrix = np.zeros((n, n), dtype=np.int64)
    for idx in range(len(dataset)):
        name = osp.splitext(osp.basename(dataset.get_data_info(idx)['img_path']))[0] + '.png'
        pred_file = osp.join(path, name)
        if not osp.isfile(pred_file):
            fail(f'No prediction {name} in {path} for test image {idx}: were the predictions '
                 'made with this config\'s test_dataloader?')
        gt = dataset[idx]['data_samples'].gt_sem_seg.data.squeeze(0).numpy().astype(np.int64)
        pred = np.asarray(Image.open(pred_file)).astype(np.int64)
        if dataset.reduce_zero_label:  # IoUMetric wrote them back in the dataset's numbering
            pred = pred - 1
        if pred.shape != gt.shape:
            fail(f'{pred_file} is {pred.shape[1]}x{pred.shape[0]}, its ground truth '
                 f'{gt.shape[1]}x{gt.shape[0]}: the test pipeline must load the annotations '
                 'after Resize (as mmseg\'s configs do).')
        keep = gt != dataset.ignore_index
        gt, pred = gt[keep], pred[keep]
        if len(pred) and (pred.min() < 0 or pred.max() >= n):
            fail(f'{pred_file} holds label {pred.min() if pred.min() < 0 else pred.max()} '
                 f'outside the {n} classes of the config.')
        matrix += np.bincount(n * gt + pred, minlength=n * n).reshape(n, n)
    return matrix, classes


def main(argv=None):
    assert_environment()
    from mmplugin_inline import tools_common
    args = parse_args(argv)
    cfg, codebase = tools_common.load_tool_config(args.config, args.cfg_options)
    script = tools_common.codebase_script(codebase, 'analysis_tools/confusion_matrix.py')
    if codebase == 'mmdet':
        matrix, labels = detection_matrix(script, cfg, args.prediction_path, args)
    else:
        matrix, labels = segmentation_matrix(cfg, args.prediction_path)
    show = tools_common.can_show(args.show, f'the figure is written to {args.save_dir}')
    os.makedirs(args.save_dir, exist_ok=True)
    with np.errstate(invalid='ignore', divide='ignore'):  # a class without ground truth: nan
        script.plot_confusion_matrix(
            matrix, labels, save_dir=args.save_dir, show=show, title=args.title,
            color_theme=args.color_theme or ('plasma' if codebase == 'mmdet' else 'OrRd'))
    width = max(len(str(label)) for label in labels)
    print('\nCounts (rows: ground truth, columns: prediction):')
    column = max(width, len(str(int(matrix.max()))))
    print(' ' * width + ''.join(f' {label:>{column}}' for label in labels))
    for label, row in zip(labels, matrix):
        print(f'{label:>{width}}' + ''.join(f' {int(v):>{column}d}' for v in row))
    print(f'wrote {osp.join(args.save_dir, "confusion_matrix.png")}')
    return matrix

