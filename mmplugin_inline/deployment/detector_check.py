"""Comparing an exported detector's detections with mmdet's own ``predict``: the
reference detections of the PyTorch model and their matching by box overlap."""
from typing import Dict, Optional, Tuple

import torch


def box_iou(a, b):
    """IoU matrix of boxes ``a`` [n, 4] and ``b`` [m, 4] (numpy)."""
    import numpy as np
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clip(0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clip(0).prod(-1)
    union = area_a[:, None] + area_b[None] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def match_detections(ref: Dict, got: Dict, iou: float = 0.99, score_tol: float = 1e-3,
                     box_tol: float = 0.0) -> Dict:
    """Match detections ``got`` (onnxruntime) to ``ref`` (PyTorch), each a dict of numpy
    ``boxes`` [n, 4], ``scores`` [n], ``labels`` [n]: greedily, by ``ref``'s descending score,
    to an unmatched detection of the same label with box IoU >= ``iou`` (or every
    coordinate within ``box_tol`` pixels: rounded boxes thinner than a pixel lose IoU to
    the rounding alone) and score within ``score_tol``. Returns ``matched``, ``ref``,
    ``got`` (counts), ``pairs`` (index into ``ref``, index into ``got``) and ``share``:
    matched over the larger count (1.0 when both are empty), so extra or missing
    detections on either side count against it."""
    import numpy as np
    n, m = len(ref['scores']), len(got['scores'])
    pairs = []
    if n and m:
        ious = box_iou(ref['boxes'], got['boxes'])
        near = np.abs(ref['boxes'][:, None, :] - got['boxes'][None, :, :]).max(-1) <= box_tol
        free = np.ones(m, dtype=bool)
        for i in np.argsort(-ref['scores'], kind='stable'):
            ok = free & (got['labels'] == ref['labels'][i]) & ((ious[i] >= iou) | near[i]) & \
                (np.abs(got['scores'] - ref['scores'][i]) <= score_tol)
            if ok.any():
                j = int(np.argmax(np.where(ok, ious[i], -1)))
                free[j] = False
                pairs.append((int(i), j))
    share = 1.0 if max(n, m) == 0 else len(pairs) / max(n, m)
    return dict(matched=len(pairs), ref=n, got=m, share=share, pairs=pairs)


def detector_data_sample(hw: Tuple[int, int], img_hw: Optional[Tuple[int, int]] = None):
    """The ``DetDataSample`` of an input of size ``hw`` holding an image of ``img_hw``
    (default: the whole input) at its top left, seen as the original (no resize): what
    ``predict(..., rescale=False)`` needs."""
    from mmdet.structures import DetDataSample
    h, w = hw
    img_hw = tuple(img_hw or hw)
    return DetDataSample(metainfo=dict(img_shape=img_hw, ori_shape=img_hw, pad_shape=(h, w),
                                       batch_input_shape=(h, w), scale_factor=(1.0, 1.0)))


def torch_detections(detector, inputs: torch.Tensor,
                     img_hw: Optional[Tuple[int, int]] = None) -> Dict:
    """mmdet's ``predict(inputs, rescale=False)`` on one image of ``img_hw`` (default:
    the input's size) as numpy ``boxes``, ``scores``, ``labels`` (and ``masks``, padded
    with zeros to the input's size)."""
    import numpy as np
    sample = detector_data_sample(tuple(inputs.shape[2:]), img_hw)
    with torch.no_grad():
        pred = detector.predict(inputs, [sample], rescale=False)[0].pred_instances
    out = dict(boxes=pred.bboxes.numpy(), scores=pred.scores.numpy(),
               labels=pred.labels.numpy())
    if 'masks' in pred:
        masks = pred.masks.numpy()
        out['masks'] = np.zeros((len(masks),) + tuple(inputs.shape[2:]), bool)
        out['masks'][:, :masks.shape[1], :masks.shape[2]] = masks
    return out
