"""COCO mAP of a whole detector's ONNX file through the onnxruntime path
(``tools/deployment/onnx_coco_eval.py``).

Usage::

    python tools/deployment/onnx_coco_eval.py MODEL.onnx ANN_FILE IMG_DIR [--limit N]
        [--out METRICS.json]

Each image of ``ANN_FILE`` (COCO json) under ``IMG_DIR`` goes through
``onnx_inference.py``'s preprocessing, onnxruntime and its detections in the original
image's coordinates (:mod:`mmplugin_inline.deployment.runtime`); the bbox and segm mAP
are computed with pycocotools as mmdet's ``CocoMetric`` does
(:mod:`mmplugin_inline.deployment.coco_eval`), to compare with ``tools/test.py`` on the
same checkpoint.
"""
import argparse
import json
import os.path as osp


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='COCO bbox / segm mAP of a whole detector exported to ONNX, through '
                    'onnxruntime')
    parser.add_argument('model', help='the .onnx file (pytorch2onnx.py, whole detector)')
    parser.add_argument('ann_file', help='COCO annotation json')
    parser.add_argument('img_dir', help='folder of the annotation file\'s images')
    parser.add_argument('--limit', type=int, default=None, help='only the first N images')
    parser.add_argument('--out', default=None, help='write the metrics to this json file')
    return parser.parse_args(argv)


def main(argv=None):
    from mmplugin_inline.tools_common import fail

    from ..deployment.coco_eval import coco_map, onnx_coco_results
    from ..deployment.runtime import InferenceError
    args = parse_args(argv)
    for path, what in ((args.ann_file, 'annotation file'), (args.img_dir, 'image folder')):
        if not osp.exists(path):
            fail(f'{what} not found: {path}')
    try:
        results, coco, img_ids = onnx_coco_results(args.model, args.ann_file, args.img_dir,
                                                   args.limit)
    except (InferenceError, ValueError) as exc:
        fail(str(exc))
    metrics = coco_map(results, coco, img_ids)
    metrics['images'] = len(img_ids)
    print(json.dumps(metrics))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(metrics, f, indent=1)
    return 0
