# Mask R-CNN, InLine-CSwin-T backbone, FPN, 1x (12 epochs), COCO instance segmentation,
# single scale 1333x800; the Swin / CSWin detection recipe (AdamW lr 1e-4, weight
# decay 0.05 except on norms).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedules/adamw_det_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
]
custom_imports = dict(imports=['mmplugin_inline'], allow_failed_imports=False)

# ImageNet-1K weights released by the InLine authors (see README, "Pretrained weights"),
# expected at this path relative to the working directory.
pretrained = 'checkpoints/inline_cswin_t.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='InLineCSWinTransformer',
        arch='t',
        split_size=(1, 2, 7, 7),
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        out_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 256, 512]))
# the stem's LayerNorm (stages.0.downsample.2) is not named "norm"
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'stages.0.downsample.2': dict(decay_mult=0.)}))
