# Cascade Mask R-CNN, InLine-Swin-T backbone, FPN, 3x (36 epochs), COCO instance segmentation,
# multi-scale + crop training; the Swin detection recipe (AdamW lr 1e-4, weight decay 0.05).
_base_ = [
    '../_base_/models/cascade-mask-rcnn_inline-swin-t_fpn.py',
    '../_base_/datasets/coco_instance_ms-crop.py',
    '../_base_/schedules/adamw_det_3x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
]
