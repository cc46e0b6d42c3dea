# UperNet, InLine-DeiT-S backbone (a plain ViT: stride-16 maps after blocks 3, 6, 9, 12,
# the last one normed) with mmseg's MultiLevelNeck (rescaled 4x, 2x, 1x, 0.5x), 160k,
# ADE20K 512x512; the ViT segmentation recipe (AdamW lr 6e-5, weight decay 0.01 except on
# norms, position embedding and cls token, 1500-iteration warm-up, poly), batch 16.
_base_ = [
    'mmseg::_base_/models/upernet_vit-b16_ln_mln.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
    '../_base_/schedules/adamw_seg_160k.py',
]
custom_imports = dict(imports=['mmplugin_inline'], allow_failed_imports=False)

# ImageNet-1K weights released by the InLine authors (see README, "Pretrained weights"),
# expected at this path relative to the working directory. InLine-DeiT-S was trained at
# 288x288; its position embedding is resized to the input.
pretrained = 'checkpoints/inline_deit_s.pth'
crop_size = (512, 512)
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        _delete_=True,
        type='InLineDeiT',
        arch='s',
        out_indices=(2, 5, 8, 11),
        final_norm=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[320, 320, 320, 320], out_channels=320, scales=[4, 2, 1, 0.5]),
    decode_head=dict(in_channels=[320, 320, 320, 320], num_classes=150),
    auxiliary_head=dict(in_channels=320, num_classes=150))
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
