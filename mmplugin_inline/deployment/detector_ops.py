"""The tensor-only pieces of a two-stage detector's prediction path that
:class:`~.detector.TwoStageDetectorGraph` is made of: box decoding, NMS, anchors, RoI
pooling over levels and mask pasting, each named after the mmdet function it follows."""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


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
