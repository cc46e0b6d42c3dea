# Mask R-CNN, InLine-PVT-T backbone, FPN, 1x (12 epochs), COCO instance segmentation.
# The PVT detection recipe: AdamW lr 1e-4, weight decay 1e-4, single scale 1333x800,
# steps at epochs 8 and 11, batch 16 (8 GPUs x 2 images).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
]
custom_imports = dict(imports=['mmplugin_inline'], allow_failed_imports=False)

# ImageNet-1K weights released by the InLine authors (see README, "Pretrained weights"),
# expected at this path relative to the working directory.
pretrained = 'checkpoints/inline_pvt_t.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='InLinePVT',
        arch='t',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
