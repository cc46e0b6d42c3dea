# Mask R-CNN, InLine-DeiT-S backbone (a plain ViT: the stride-16 map of its last block) with
# a ViTDet-style SimpleFeaturePyramid (strides 4 to 64), 1x (12 epochs), COCO instance
# segmentation, single scale 1333x800. The Swin detection recipe of the other families
# (AdamW lr 1e-4, weight decay 0.05 except on norms, position embedding and cls token),
# not ViTDet's long schedule with layer-wise lr decay; batch 16 (8 GPUs x 2 images).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedules/adamw_det_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
]
custom_imports = dict(imports=['mmplugin_inline'], allow_failed_imports=False)

# ImageNet-1K weights released by the InLine authors (see README, "Pretrained weights"),
# expected at this path relative to the working directory. InLine-DeiT-S was trained at
# 288x288; its position embedding is resized to the input. Without a final norm (as in
# ViTDet) the checkpoint's final norm is dropped on loading.
pretrained = 'checkpoints/inline_deit_s.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='InLineDeiT',
        arch='s',
        out_indices=(11,),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(
        _delete_=True,
        type='SimpleFeaturePyramid',
        in_channels=320,
        out_channels=256,
        scale_factors=(4.0, 2.0, 1.0, 0.5),
        num_outs=5))
