"""Pictures and numbers after a demo run: a prediction grid, training curves, final metrics.

    python tools/misc/demo_report.py CONFIG CHECKPOINT WORK_DIR --out-dir DIR

Writes ``DIR/predictions.png`` (validation images: ground truth left, prediction
right; boxes and masks for mmdet, a label overlay for mmseg) and ``DIR/curves.png``
(training loss and the validation metric over iterations, read from the run's
``vis_data/scalars.json``), prints the final metrics and saves them to
``DIR/metrics.json``.
"""
import argparse
import json
import os
import os.path as osp
import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

HEADLINE = {'mmdet': ('coco/bbox_mAP', 'coco/segm_mAP'), 'mmseg': ('mIoU', 'mAcc', 'aAcc')}


def read_scalars(work_dir):
    """Training and validation records of the newest run in ``work_dir``."""
    from ..analysis.scalars import read_scalars, scalars_files
    if not scalars_files(work_dir):
        raise FileNotFoundError(f'no */vis_data/scalars.json under {work_dir}: was it the '
                                'work directory of a finished run?')
    train, val = [], []
    for rec in read_scalars(work_dir):  # a resumed run continues in a new timestamped folder
        (train if 'loss' in rec else val).append(rec)
    return train, val


def plot_curves(train, val, metric_keys, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([r['step'] for r in train], [r['loss'] for r in train], color='tab:blue',
            label='training loss')
    ax.set_xlabel('iteration')
    ax.set_ylabel('training loss', color='tab:blue')
    ax2 = ax.twinx()
    for key in metric_keys:
        pts = [(r['step'], r[key]) for r in val if key in r]
        if pts:
            ax2.plot(*zip(*pts), marker='o', label=key)
    ax2.set_ylabel('validation metric')
    ax2.set_ylim(0, max(1.0, ax2.get_ylim()[1]))
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax2.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc='center right')
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def grid(images, columns=2, pad=4):
    """Tile RGB images (any sizes) into one image, ``columns`` per row."""
    import numpy as np
    h = max(im.shape[0] for im in images) + pad
    w = max(im.shape[1] for im in images) + pad
    rows = -(-len(images) // columns)
    canvas = np.full((rows * h, columns * w, 3), 255, dtype=np.uint8)
    for i, im in enumerate(images):
        r, c = divmod(i, columns)
        canvas[r * h:r * h + im.shape[0], c * w:c * w + im.shape[1]] = im
    return canvas


def detection_pictures(cfg, checkpoint, num, score_thr):
    import mmcv
    import numpy as np
    import torch
    from mmdet.apis import inference_detector, init_detector
    from mmdet.registry import DATASETS, VISUALIZERS
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import PolygonMasks
    from mmengine.structures import InstanceData

    from mmplugin_inline.weights import mmengine_checkpoint_loading
    with mmengine_checkpoint_loading():
        model = init_detector(cfg, checkpoint, device='cpu')
    dataset = DATASETS.build(cfg.val_dataloader.dataset)
    vis = VISUALIZERS.build(dict(type='DetLocalVisualizer', name='demo_report'))
    vis.dataset_meta = model.dataset_meta
    out = []
    for i in range(min(num, len(dataset))):
        info = dataset.get_data_info(i)
        image = mmcv.imread(info['img_path'], channel_order='rgb')
        pred = inference_detector(model, info['img_path'])
        gt = InstanceData()
        inst = [x for x in info['instances'] if not x.get('ignore_flag', 0)]
        gt.bboxes = torch.tensor([x['bbox'] for x in inst], dtype=torch.float32).reshape(-1, 4)
        gt.labels = torch.tensor([x['bbox_label'] for x in inst], dtype=torch.long)
        gt.masks = PolygonMasks([[np.array(p) for p in x['mask']] for x in inst],
                                image.shape[0], image.shape[1])
        sample = DetDataSample()
        sample.gt_instances = gt
        sample.pred_instances = pred.pred_instances
        vis.add_datasample(f'val{i}', image, sample, draw_gt=True, draw_pred=True, show=False,
                           pred_score_thr=score_thr)
        out.append(vis.get_image())
    return out


def segmentation_pictures(cfg, checkpoint, num):
    import mmcv
    import torch
    from mmengine.structures import PixelData
    from mmseg.apis import inference_model, init_model
    from mmseg.registry import DATASETS, VISUALIZERS

    from mmplugin_inline.weights import mmengine_checkpoint_loading
    with mmengine_checkpoint_loading():
        model = init_model(cfg, checkpoint, device='cpu')
    dataset = DATASETS.build(cfg.val_dataloader.dataset)
    vis = VISUALIZERS.build(dict(type='SegLocalVisualizer', name='demo_report', alpha=0.6))
    vis.dataset_meta = model.dataset_meta
    out = []
    for i in range(min(num, len(dataset))):
        info = dataset.get_data_info(i)
        image = mmcv.imread(info['img_path'], channel_order='rgb')
        sample = inference_model(model, info['img_path'])
        label = mmcv.imread(info['seg_map_path'], flag='unchanged').astype('int64')
        if info.get('reduce_zero_label'):
            label = label - 1
            label[label < 0] = 255
        sample.gt_sem_seg = PixelData(data=torch.from_numpy(label)[None])
        vis.add_datasample(f'val{i}', image, sample, draw_gt=True, draw_pred=True, show=False)
        out.append(vis.get_image())
    return out


def trained_iterations(checkpoint: str) -> int:
    """The iterations the run had trained when ``checkpoint`` was saved (its ``meta``);
    the logged training scalars only hold every ``LoggerHook.interval``-th."""
    from mmplugin_inline.weights import load_run_checkpoint
    return int(load_run_checkpoint(checkpoint, map_location='cpu')['meta']['iter'])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('work_dir', help='work directory of the training run')
    parser.add_argument('--out-dir', required=True)
    parser.add_argument('--num-images', type=int, default=8)
    parser.add_argument('--score-thr', type=float, default=0.5)
    from mmplugin_inline.tools_common import add_cfg_options, load_tool_config
    add_cfg_options(parser)
    args = parser.parse_args(argv)

    import mmcv
    from mmengine.registry import init_default_scope

    import mmplugin_inline  # noqa: F401
    cfg, scope = load_tool_config(args.config, args.cfg_options)
    init_default_scope(scope)
    os.makedirs(args.out_dir, exist_ok=True)

    train, val = read_scalars(args.work_dir)
    keys = HEADLINE.get(scope, ())
    curves = osp.join(args.out_dir, 'curves.png')
    plot_curves(train, val, keys, curves)
    final = {k: v for k, v in (val[-1] if val else {}).items() if k != 'step'}

    if scope == 'mmseg':
        pictures = segmentation_pictures(cfg, args.checkpoint, args.num_images)
    else:
        pictures = detection_pictures(cfg, args.checkpoint, args.num_images, args.score_thr)
    predictions = osp.join(args.out_dir, 'predictions.png')
    mmcv.imwrite(grid(pictures)[..., ::-1], predictions)

    with open(osp.join(args.out_dir, 'metrics.json'), 'w') as f:
        history = [dict(step=r['step'], **{k: r[k] for k in keys if k in r}) for r in val]
        json.dump(dict(final=final, iterations=trained_iterations(args.checkpoint),
                       validations=history), f, indent=1)
    print('final validation metrics: ' + ', '.join(
        f'{k} {final[k]:.3f}' for k in keys if k in final))
    print(f'prediction grid (ground truth | prediction): {predictions}')
    print(f'training loss and validation metric: {curves}')
    return final

