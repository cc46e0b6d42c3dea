# UperNet, InLine-Swin-T backbone, 80k iterations, Cityscapes: trained on 1024x1024 crops,
# tested on whole 1024x2048 images (no sliding window) -- the case where linear attention
# matters most. The Swin segmentation recipe (AdamW lr 6e-5, weight decay 0.01,
# 1500-iteration warm-up, poly), batch 8 (8 GPUs x 1 image).
_base_ = [
    '../_base_/models/upernet_inline-swin-t.py',
    'mmseg::_base_/datasets/cityscapes_1024x1024.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
    '../_base_/schedules/adamw_seg_160k.py',
]
crop_size = (1024, 1024)
model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(num_classes=19),
    auxiliary_head=dict(num_classes=19),
    test_cfg=dict(mode='whole'))
max_iters = 80000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=max_iters, by_epoch=False),
]
train_cfg = dict(max_iters=max_iters, val_interval=8000)
default_hooks = dict(checkpoint=dict(interval=8000))
train_dataloader = dict(batch_size=1)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
