"""The prediction path of an mmdet two-stage detector (Mask R-CNN, Cascade (Mask) R-CNN)
as one tensor-only module that ``torch.export`` can trace and ONNX can hold.

mmdet's ``predict`` passes ``InstanceData`` and image metas between its stages, branches
in Python on how many boxes are left (``if rois.shape[0] == 0``, ``if not
valid_mask.all()``, ``torch.isinf(...).any()``) and calls mmcv's compiled ``nms`` and
``RoIAlign``. None of that can be exported with a dynamic input size: the branches would
be fixed to the example's outcome, and the compiled ops have no ONNX form. So
:class:`TwoStageDetectorGraph` re-states the same computation on tensors, reusing the
model's own modules for everything that is a network (backbone, neck, the heads' layers,
the anchor generator, the box coders' parameters) and torchvision's ``nms`` /
``roi_align`` for the two compiled ops. Both have standard ONNX forms
(``NonMaxSuppression``, ``RoiAlign``) in torch's exporter, so the file needs no custom
op library. Where mmdet skips work on an empty set, the graph simply runs on zero rows.
The PyTorch model itself is not changed; :func:`verify_detector` compares the two.

Each step names the mmdet function it follows. Differences, all without effect on the
result: the RoI extractor runs ``roi_align`` of every RoI on every level and keeps each
RoI's own level (mmdet gathers the RoIs of a level first: a data-dependent split), and
masks are sampled over the whole image and then cut to the box's extent plus one pixel,
where mmdet pastes them (a region of data-dependent size).
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .onnx import INPUT_NAME

#: what the exported detector returns, in this order (the last two with a mask head):
#: ``mask_probs`` [N, m, m] are the mask head's probabilities of each detection's class,
#: which a runtime pastes at the original image size as mmdet's ``rescale=True`` does
DETECTOR_OUTPUTS = ('boxes', 'scores', 'labels', 'masks', 'mask_probs')


def decode_deltas(priors: torch.Tensor, deltas: torch.Tensor, coder, max_hw: Tuple,
                  wh_ratio_clip: float = 16 / 1000) -> torch.Tensor:
    """mmdet's ``delta2bbox`` (``DeltaXYWHBBoxCoder.decode`` with the coder's means, stds
    and ``clip_border``) without its branch on an empty input: ``priors`` [n, 4] and
    ``deltas`` [n, k * 4] -> boxes [n, k, 4], clipped to ``max_hw`` (H, W: ints, or
    0-d tensors when the image's size is a graph input)."""
    deltas = deltas.unflatten(1, (-1, 4))                          # [n, k, 4]
    deltas = deltas * deltas.new_tensor(coder.stds) + deltas.new_tensor(coder.means)
    dxy, dwh = deltas[..., :2], deltas[..., 2:]
    priors = priors[:, None, :]                                    # [n, 1, 4]
    pxy = (priors[..., :2] + priors[..., 2:]) * 0.5
    pwh = priors[..., 2:] - priors[..., :2]
    dxy_wh = pwh * dxy
    max_ratio = abs(math.log(wh_ratio_clip))
    dwh = dwh.clamp(min=-max_ratio, max=max_ratio)
    gxy = pxy + dxy_wh
    gwh = pwh * dwh.exp()
    x1y1 = gxy - gwh * 0.5
    x2y2 = gxy + gwh * 0.5
    boxes = torch.cat([x1y1, x2y2], dim=-1)                         # [n, k, 4]
    if coder.clip_border:
        h, w = max_hw
        x = _clamp(boxes[..., 0::2], w)
        y = _clamp(boxes[..., 1::2], h)
        boxes = torch.stack([x[..., 0], y[..., 0], x[..., 1], y[..., 1]], dim=-1)
    return boxes


def _clamp(values: torch.Tensor, upper) -> torch.Tensor:
    """``values`` clamped to [0, ``upper``], an int or a 0-d tensor."""
    if isinstance(upper, torch.Tensor):
        return torch.minimum(values.clamp(min=0), upper.to(values.dtype))
    return values.clamp(min=0, max=upper)


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor,
                iou_threshold: float) -> torch.Tensor:
    """Indices kept by NMS within each ``idxs`` group, by descending score: mmcv's
    ``batched_nms`` (its offset trick: each group's boxes moved beyond the others') with
    torchvision's ``nms``, which ONNX holds as ``NonMaxSuppression``."""
    from torchvision.ops import nms
    # boxes.max() of zero boxes is an error; the pad keeps the offset defined (and 1)
    max_coordinate = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
    offsets = idxs.to(boxes) * (max_coordinate + 1)
    return nms(boxes + offsets[:, None], scores, iou_threshold)


def grid_anchors(generator, level: int, hw: Tuple, dtype) -> torch.Tensor:
    """mmdet ``AnchorGenerator.single_level_grid_priors`` of one level by broadcasting:
    [h * w * A, 4], location-major (row by row), anchors within a location. (mmdet's own
    ``repeat``-based mesh grid came out of the export with the example's sizes.)"""
    if type(generator).__name__ != 'AnchorGenerator':
        raise ValueError(f'only AnchorGenerator priors can be exported, got '
                         f'{type(generator).__name__}')
    base = generator.base_anchors[level].to(dtype)                  # [A, 4]
    stride_w, stride_h = generator.strides[level]
    h, w = hw
    sx = torch.arange(w, device=base.device).to(dtype) * stride_w
    sy = torch.arange(h, device=base.device).to(dtype) * stride_h
    sx = sx[None, :].expand(h, w)
    sy = sy[:, None].expand(h, w)
    shifts = torch.stack([sx, sy, sx, sy], dim=-1).reshape(-1, 1, 4)  # [h*w, 1, 4]
    return (shifts + base[None]).reshape(-1, 4)


def first(values: torch.Tensor, num: int) -> torch.Tensor:
    """``values[:num]`` for a tensor of data-dependent length (what NMS keeps).

    The bound is min(num, length), stated to lie within the length: torch 2.9's exporter
    cannot decide a slice of a data-dependent length by itself ("Could not guard on
    data-dependent expression u1 < 100"); torch 2.10 and newer can.
    """
    end = torch.sym_min(num, values.shape[0])
    torch._check(end <= values.shape[0])
    return values[:end]


def nms_threshold(nms_cfg) -> float:
    """The IoU threshold of an mmdet ``nms`` config (only plain NMS is exportable here)."""
    if nms_cfg.get('type', 'nms') != 'nms':
        raise ValueError(f"only test_cfg nms of type 'nms' can be exported, got {nms_cfg}")
    return float(nms_cfg['iou_threshold'])


class MultiLevelRoIAlign(nn.Module):
    """mmdet's ``SingleRoIExtractor`` with torchvision's ``roi_align`` (mmcv's RoIAlign,
    ``aligned=True``, average pooling, is the same operator): every RoI is pooled on every
    level and keeps the one ``map_roi_levels`` assigns it."""

    def __init__(self, extractor):
        super().__init__()
        if getattr(extractor, 'roi_scale_factor', None) not in (None, 1, 1.0):
            raise ValueError('RoI extractors with roi_scale_factor cannot be exported')
        layers = extractor.roi_layers
        for layer in layers:
            pool_mode = getattr(layer, 'pool_mode', 'avg')
            if pool_mode != 'avg' or not hasattr(layer, 'sampling_ratio'):
                raise ValueError(f'only RoIAlign (average pooling) RoI layers can be exported; '
                                 f'got {layer}')
        self.num_inputs = extractor.num_inputs
        self.finest_scale = extractor.finest_scale
        self.output_size = tuple(layers[0].output_size)
        self.scales = [float(layer.spatial_scale) for layer in layers]
        self.sampling_ratio = [int(layer.sampling_ratio) for layer in layers]
        self.aligned = [bool(layer.aligned) for layer in layers]

    def forward(self, feats: Sequence[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        """``feats``: the levels [1, C, h_l, w_l]; ``rois`` [n, 5] (batch index, x1, y1,
        x2, y2) -> [n, C, out_h, out_w]."""
        from torchvision.ops import roi_align
        feats = feats[:self.num_inputs]
        if len(feats) == 1:
            return roi_align(feats[0], rois, self.output_size, self.scales[0],
                             self.sampling_ratio[0], self.aligned[0])
        scale = torch.sqrt((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2]))
        levels = torch.floor(torch.log2(scale / self.finest_scale + 1e-6))
        levels = levels.clamp(min=0, max=len(feats) - 1).long()      # [n]
        out = None
        for i, feat in enumerate(feats):
            pooled = roi_align(feat, rois, self.output_size, self.scales[i],
                               self.sampling_ratio[i], self.aligned[i])
            keep = (levels == i)[:, None, None, None]
            out = torch.where(keep, pooled, torch.zeros_like(pooled)) if out is None \
                else torch.where(keep, pooled, out)
        return out


def paste_masks(masks: torch.Tensor, boxes: torch.Tensor, hw: Tuple,
                threshold: float, img_hw: Optional[Tuple] = None) -> torch.Tensor:
    """mmdet's ``_do_paste_mask`` over the whole input: ``masks`` [n, m, m] of
    probabilities and ``boxes`` [n, 4] -> [n, H, W] bool (``>= threshold``) for an input
    of ``hw``, zero outside the image's ``img_hw`` (ints or 0-d tensors; default ``hw``)
    at its top left, where mmdet's mask of the image ends."""
    h, w = hw
    img_h, img_w = img_hw if img_hw is not None else hw
    x0, y0, x1, y1 = boxes.split(1, dim=1)                          # [n, 1] each
    img_y = torch.arange(h, device=boxes.device).to(torch.float32) + 0.5
    img_x = torch.arange(w, device=boxes.device).to(torch.float32) + 0.5
    img_y = (img_y - y0) / (y1 - y0) * 2 - 1                        # [n, H]
    img_x = (img_x - x0) / (x1 - x0) * 2 - 1                        # [n, W]
    img_y = torch.where(torch.isinf(img_y), torch.zeros_like(img_y), img_y)
    img_x = torch.where(torch.isinf(img_x), torch.zeros_like(img_x), img_x)
    n = masks.shape[0]
    gx = img_x[:, None, :].expand(n, img_y.shape[1], img_x.shape[1])
    gy = img_y[:, :, None].expand(n, img_y.shape[1], img_x.shape[1])
    grid = torch.stack([gx, gy], dim=3)                             # [n, H, W, 2]
    pasted = F.grid_sample(masks[:, None].float(), grid, align_corners=False)[:, 0]
    # mmdet pastes on the CPU into the box's extent plus a pixel (skip_empty); outside it
    # the value is below 0.5 anyway, except for a box of zero width or height (its inf
    # grid becomes 0, which would sample the mask's middle across the whole image)
    x_lo = (x0.floor() - 1).clamp(min=0)
    y_lo = (y0.floor() - 1).clamp(min=0)
    x_hi = _clamp(x1.ceil() + 1, img_w)
    y_hi = _clamp(y1.ceil() + 1, img_h)
    cols = torch.arange(w, device=boxes.device)[None, :]
    rows = torch.arange(h, device=boxes.device)[None, :]
    inside = ((rows >= y_lo) & (rows < y_hi))[:, :, None] & \
        ((cols >= x_lo) & (cols < x_hi))[:, None, :]                   # [n, H, W]
    return (pasted >= threshold) & inside


class TwoStageDetectorGraph(nn.Module):
    """``forward(inputs, img_hw)``: the data preprocessor's output [1, 3, H, W] and the
    height and width of the image inside it (int64 [2]: mmdet's ``img_shape``, the resized
    image before the batch padding; ``[H, W]`` for an input that is not padded) ->
    ``boxes`` [N, 4] (x1, y1, x2, y2 in input pixels, clipped to the image), ``scores``
    [N], ``labels`` [N] int64 and, for detectors with a mask head, ``masks`` [N, H, W]
    bool: what mmdet's ``predict(..., rescale=False)`` gives, after RPN, the RoI head(s),
    NMS and mask pasting, under the model's ``test_cfg``. With a mask head it also returns
    ``mask_probs`` [N, m, m], the probabilities that were pasted.

    Supported: ``TwoStageDetector`` with an ``RPNHead`` (sigmoid, delta coder) and a
    ``StandardRoIHead`` or ``CascadeRoIHead`` with box heads of softmax classes and delta
    coders, FCN mask heads, plain NMS. Anything else raises ValueError naming it.
    """

    def __init__(self, detector):
        super().__init__()
        self.detector = detector
        rpn, roi = detector.rpn_head, detector.roi_head
        _check_rpn(rpn)
        self.cascade = hasattr(roi, 'num_stages')
        bbox_heads = list(roi.bbox_head) if self.cascade else [roi.bbox_head]
        bbox_extractors = list(roi.bbox_roi_extractor) if self.cascade \
            else [roi.bbox_roi_extractor]
        for head in bbox_heads:
            _check_bbox_head(head)
        self.bbox_extractors = nn.ModuleList(MultiLevelRoIAlign(e) for e in bbox_extractors)
        self.with_mask = bool(getattr(roi, 'with_mask', False))
        if self.with_mask:
            mask_heads = list(roi.mask_head) if self.cascade else [roi.mask_head]
            mask_extractors = (roi.mask_roi_extractor if not roi.share_roi_extractor
                               else roi.bbox_roi_extractor)
            mask_extractors = list(mask_extractors) if self.cascade else [mask_extractors]
            for head in mask_heads:
                if type(head).__name__ != 'FCNMaskHead' or head.class_agnostic:
                    raise ValueError(f'only class-specific FCNMaskHead mask heads can be '
                                     f'exported, got {type(head).__name__}')
            self.mask_extractors = nn.ModuleList(MultiLevelRoIAlign(e) for e in mask_extractors)
        if self.cascade:
            self.stage_loss_weights = list(roi.stage_loss_weights)
        self.rpn_cfg = detector.test_cfg.rpn
        self.rcnn_cfg = detector.test_cfg.rcnn

    #: the graph's inputs, in the order of ``forward``
    input_names = (INPUT_NAME, 'img_hw')

    @staticmethod
    def example_inputs(inputs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``forward``'s arguments for an unpadded ``inputs``."""
        return inputs, torch.tensor(inputs.shape[2:], dtype=torch.int64)

    @property
    def output_names(self) -> List[str]:
        return list(DETECTOR_OUTPUTS if self.with_mask else DETECTOR_OUTPUTS[:3])

    # -- RPN: mmdet RPNHead.predict_by_feat / _bbox_post_process ---------------------
    def proposals(self, feats, hw) -> torch.Tensor:
        """RPN proposals [n, 4] of image 0, at most ``test_cfg.rpn.max_per_img``."""
        rpn, cfg = self.detector.rpn_head, self.rpn_cfg
        cls_scores, bbox_preds = rpn(feats)
        priors = [grid_anchors(rpn.prior_generator, level, s.shape[-2:], s.dtype)
                  for level, s in enumerate(cls_scores)]
        nms_pre = cfg.get('nms_pre', -1)
        boxes, scores, levels = [], [], []
        for level, (cls, reg, anchors) in enumerate(zip(cls_scores, bbox_preds, priors)):
            score = cls[0].permute(1, 2, 0).reshape(-1).sigmoid()
            # [h * w * A, 4] in mmdet's order; the 4 coordinates stacked, not reshaped:
            # torch 2.9's exporter gives the extra pooled level's reshape a width that is
            # not 4 at run time
            per_coord = reg[0].unflatten(0, (-1, 4)).permute(2, 3, 0, 1)  # [h, w, A, 4]
            reg = torch.stack([per_coord[..., i].reshape(-1) for i in range(4)], dim=-1)
            if nms_pre > 0:
                k = torch.sym_min(nms_pre, score.shape[0])
                score, order = score.topk(k)
                reg, anchors = reg[order], anchors[order]
            boxes.append(decode_deltas(anchors, reg, rpn.bbox_coder, hw)[:, 0])
            scores.append(score)
            levels.append(torch.full_like(score, level, dtype=torch.long))
        boxes, scores, levels = torch.cat(boxes), torch.cat(scores), torch.cat(levels)
        min_size = cfg.get('min_bbox_size', -1)
        if min_size >= 0:
            wh = boxes[:, 2:] - boxes[:, :2]
            valid = ((wh[:, 0] > min_size) & (wh[:, 1] > min_size)).nonzero()[:, 0]
            boxes, scores, levels = boxes[valid], scores[valid], levels[valid]
        keep = batched_nms(boxes, scores, levels, nms_threshold(cfg.nms))
        return boxes[first(keep, cfg.max_per_img)]

    # -- RoI heads: mmdet StandardRoIHead / CascadeRoIHead.predict_bbox ---------------
    def _bbox_forward(self, stage, feats, rois):
        head = self.detector.roi_head.bbox_head
        head = head[stage] if self.cascade else head
        return head(self.bbox_extractors[stage](feats, rois))

    def detect(self, feats, proposals, hw):
        """Final boxes [N, 4], scores [N], labels [N] (``test_cfg.rcnn``)."""
        rois = torch.cat([proposals.new_zeros(proposals.shape[0], 1), proposals], dim=1)
        stages = len(self.bbox_extractors)
        heads = self.detector.roi_head.bbox_head
        heads = list(heads) if self.cascade else [heads]
        scores = []
        for stage in range(stages):
            cls_score, bbox_pred = self._bbox_forward(stage, feats, rois)
            scores.append(cls_score)
            if stage < stages - 1:  # CascadeRoIHead._refine_roi
                label = cls_score[:, :-1].argmax(dim=1)
                boxes = self._decode(heads[stage], rois[:, 1:], bbox_pred, hw, label)
                rois = torch.cat([rois[:, :1], boxes], dim=1)
        cls_score = scores[0] if stages == 1 else sum(scores) / float(stages)
        head = heads[-1]
        probs = F.softmax(cls_score, dim=-1)[:, :-1]                 # [n, classes]
        boxes = decode_deltas(rois[:, 1:], bbox_pred, head.bbox_coder, hw)  # [n, 1|classes, 4]
        n, classes = probs.shape
        boxes = boxes.expand(n, classes, 4)
        # mmdet multiclass_nms: every (box, class) above score_thr, NMS per class
        labels = torch.arange(classes, device=probs.device).expand(n, classes)
        boxes, probs, labels = boxes.reshape(-1, 4), probs.reshape(-1), labels.reshape(-1)
        valid = (probs > self.rcnn_cfg.score_thr).nonzero()[:, 0]
        boxes, probs, labels = boxes[valid], probs[valid], labels[valid]
        keep = batched_nms(boxes, probs, labels, nms_threshold(self.rcnn_cfg.nms))
        max_num = self.rcnn_cfg.max_per_img
        if max_num > 0:
            keep = first(keep, max_num)
        return boxes[keep], probs[keep], labels[keep]

    @staticmethod
    def _decode(head, priors, bbox_pred, hw, label):
        """``BBoxHead.regress_by_class``: the box of ``label`` (or the class-agnostic one)."""
        if not head.reg_class_agnostic:
            bbox_pred = bbox_pred.unflatten(1, (-1, 4))
            bbox_pred = bbox_pred.gather(1, label[:, None, None].expand(-1, 1, 4))[:, 0]
        return decode_deltas(priors, bbox_pred, head.bbox_coder, hw)[:, 0]

    # -- masks: StandardRoIHead / CascadeRoIHead.predict_mask, FCNMaskHead ------------
    def masks(self, feats, boxes, labels, hw, img_hw) -> Tuple[torch.Tensor, torch.Tensor]:
        """The pasted masks [N, H, W] bool and the probabilities [N, m, m] pasted."""
        rois = torch.cat([boxes.new_zeros(boxes.shape[0], 1), boxes], dim=1)
        heads = self.detector.roi_head.mask_head
        heads = list(heads) if self.cascade else [heads]
        probs = []
        for stage, head in enumerate(heads):
            pred = head(self.mask_extractors[stage](feats, rois))      # [N, classes, m, m]
            probs.append(pred.sigmoid())
        prob = probs[0] if len(probs) == 1 else torch.stack(probs).mean(dim=0)
        index = labels[:, None, None, None].expand(-1, 1, *prob.shape[-2:])
        prob = prob.gather(1, index)[:, 0]                              # [N, m, m]
        return paste_masks(prob, boxes, hw, self.rcnn_cfg.mask_thr_binary, img_hw), prob

    def forward(self, inputs: torch.Tensor, img_hw: torch.Tensor):
        hw = (inputs.shape[2], inputs.shape[3])
        image = (img_hw[0], img_hw[1])                  # boxes are clipped to the image
        feats = self.detector.extract_feat(inputs)
        proposals = self.proposals(feats, image)
        boxes, scores, labels = self.detect(feats, proposals, image)
        if not self.with_mask:
            return boxes, scores, labels
        return (boxes, scores, labels) + self.masks(feats, boxes, labels, hw, image)


def _check_coder(coder) -> None:
    if type(coder).__name__ != 'DeltaXYWHBBoxCoder' or getattr(coder, 'add_ctr_clamp', False):
        raise ValueError(f'only DeltaXYWHBBoxCoder box coders (no add_ctr_clamp) can be '
                         f'exported, got {type(coder).__name__}')


def _check_rpn(rpn) -> None:
    name = type(rpn).__name__
    if name != 'RPNHead' or not rpn.use_sigmoid_cls:
        raise ValueError(f'only RPNHead with sigmoid scores can be exported, got {name}')
    _check_coder(rpn.bbox_coder)


def _check_bbox_head(head) -> None:
    _check_coder(head.bbox_coder)
    if head.custom_cls_channels or head.custom_activation or \
            getattr(head.loss_cls, 'use_sigmoid', False) is not False:
        raise ValueError(f'only softmax box classifiers can be exported ({type(head).__name__})')


def detector_graph(detector) -> TwoStageDetectorGraph:
    """The tensor-only prediction path of ``detector``; ValueError names what is not
    supported (one-stage detectors, other heads)."""
    missing = [n for n in ('rpn_head', 'roi_head') if not hasattr(detector, n)]
    if missing:
        raise ValueError(f'whole-model export supports two-stage detectors (RPN + RoI heads: '
                         f'Mask R-CNN, Cascade Mask R-CNN); {type(detector).__name__} has no '
                         f'{" or ".join(missing)}: add --backbone-only to export its backbone')
    return TwoStageDetectorGraph(detector)


# -- verification ------------------------------------------------------------------
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
