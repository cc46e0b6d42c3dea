"""COCO bbox / segm mAP of a whole detector's ONNX file through the onnxruntime path of
``tools/deployment/onnx_inference.py`` (:mod:`.runtime`: its preprocessing, its
detections in the original image's coordinates), scored with pycocotools as mmdet's
``CocoMetric`` does (class names -> the annotation file's category ids, boxes as x, y, w,
h, every detection up to ``max_per_img``). ``tools/deployment/onnx_coco_eval.py`` runs it,
so that the exported file can be compared with ``tools/test.py`` on the same checkpoint.
"""
import contextlib
import io
import os.path as osp
from typing import Dict, Optional

import numpy as np


def onnx_coco_results(onnx_path: str, ann_file: str, img_dir: str,
                      limit: Optional[int] = None):
    """COCO result dicts (``image_id``, ``category_id``, ``bbox``, ``score``,
    ``segmentation``) of the ONNX file on the annotation file's images, and the COCO
    object."""
    import cv2
    from pycocotools.coco import COCO

    from . import runtime
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(ann_file)
    session, record = runtime.load_session(onnx_path)
    if record['task'] != 'detection':
        raise ValueError(f'{onnx_path} is a {record["task"]} model, not a detector')
    cat_ids = coco.getCatIds(catNms=record['classes'])
    if len(cat_ids) != len(record['classes']):
        raise ValueError(f'the annotation file has {len(cat_ids)} of the model\'s '
                         f'{len(record["classes"])} class names')
    results = []
    img_ids = coco.getImgIds()[:limit]
    for img_id in img_ids:
        info = coco.loadImgs([img_id])[0]
        image = cv2.imread(osp.join(img_dir, info['file_name']), cv2.IMREAD_COLOR)
        if image is None:
            raise ValueError(f'cannot read {osp.join(img_dir, info["file_name"])}')
        x, geometry = runtime.preprocess(image, record)
        outputs = runtime.run_graph(session, x, geometry)
        results += [coco_result(d, img_id, cat_ids) for d in
                    runtime.postprocess_detections(outputs, geometry, record)]
    return results, coco, img_ids


def coco_result(detection: Dict, img_id: int, cat_ids) -> Dict:
    """One detection of :func:`.runtime.postprocess_detections` (x1, y1, x2, y2; label
    index; uncompressed RLE) as a COCO result (x, y, w, h; category id; compressed RLE),
    as mmdet's ``CocoMetric.results2json`` writes it."""
    import pycocotools.mask as mask_util
    x1, y1, x2, y2 = detection['bbox']
    item = dict(image_id=img_id, category_id=cat_ids[detection['label']],
                bbox=[x1, y1, x2 - x1, y2 - y1], score=detection['score'])
    if 'mask' in detection:
        rle = mask_util.frPyObjects(detection['mask'], *detection['mask']['size'])
        rle['counts'] = rle['counts'].decode()
        item['segmentation'] = rle
    return item


def coco_map(results, coco, img_ids, iou_types=('bbox', 'segm')) -> Dict[str, float]:
    """``{'bbox_mAP': ..., 'segm_mAP': ...}`` (COCOeval's AP at IoU 0.50:0.95) of
    ``results`` on ``img_ids``; 0.0 for a type without results."""
    from pycocotools.cocoeval import COCOeval
    metrics = {}
    for iou_type in iou_types:
        items = [r for r in results if iou_type == 'bbox' or 'segmentation' in r]
        if not items:
            metrics[f'{iou_type}_mAP'] = 0.0
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            dt = coco.loadRes([dict(r) for r in items])
            ev = COCOeval(coco, dt, iou_type)
            ev.params.imgIds = list(img_ids)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        metrics[f'{iou_type}_mAP'] = float(np.round(ev.stats[0], 4))
    return metrics
