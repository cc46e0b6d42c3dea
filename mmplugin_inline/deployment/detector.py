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
The PyTorch model itself is not changed; :func:`~.verify.verify_detector` compares the
two. The tensor-only pieces are in :mod:`.detector_ops`.

Each step names the mmdet function it follows. Differences, all without effect on the
result: the RoI extractor runs ``roi_align`` of every RoI on every level and keeps each
RoI's own level (mmdet gathers the RoIs of a level first: a data-dependent split), and
masks are sampled over the whole image and then cut to the box's extent plus one pixel,
where mmdet pastes them (a region of data-dependent size).
"""
from typing import List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .detector_ops import (  # noqa: F401 (grid_anchors, paste_masks: the graph's pieces)
    MultiLevelRoIAlign,
    batched_nms,
    decode_deltas,
    first,
    grid_anchors,
    nms_threshold,
    paste_masks,
)
from .onnx import INPUT_NAME

#: what the exported detector returns, in this order (the last two with a mask head):
#: ``mask_probs`` [N, m, m] are the mask head's probabilities of each detection's class,
#: which a runtime pastes at the original image size as mmdet's ``rescale=True`` does
DETECTOR_OUTPUTS = ('boxes', 'scores', 'labels', 'masks', 'mask_probs')



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
