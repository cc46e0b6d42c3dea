# Mask R-CNN, InLine-Swin-T backbone, FPN, 1x (12 epochs), COCO instance segmentation,
# single scale 1333x800; the Swin detection recipe (AdamW lr 1e-4, weight decay 0.05).
_base_ = [
    '../_base_/models/mask-rcnn_inline-swin-t_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedules/adamw_det_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
]
