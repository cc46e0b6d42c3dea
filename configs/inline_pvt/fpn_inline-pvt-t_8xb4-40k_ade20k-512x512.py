# Semantic FPN, InLine-PVT-T backbone, 40k iterations, ADE20K 512x512; the PVT
# segmentation recipe: AdamW lr 2e-4, weight decay 1e-4, poly decay (power 0.9),
# batch 32 (8 GPUs x 4 images).
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
    'mmseg::_base_/schedules/schedule_40k.py',
]
custom_imports = dict(imports=['mmplugin_inline'], allow_failed_imports=False)

# ImageNet-1K weights released by the InLine authors (see README, "Pretrained weights"),
# expected at this path relative to the working directory.
pretrained = 'checkpoints/inline_pvt_t.pth'
crop_size = (512, 512)
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        _delete_=True,
        type='InLinePVT',
        arch='t',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512], out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0002, weight_decay=0.0001),
    clip_grad=None)
param_scheduler = [
    dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=40000, by_epoch=False)
]
train_dataloader = dict(batch_size=4)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
