# UperNet, InLine-Swin-T backbone, 160k iterations, ADE20K 512x512; the Swin
# segmentation recipe (AdamW lr 6e-5, weight decay 0.01, 1500-iteration warm-up, poly),
# batch 16 (8 GPUs x 2 images).
_base_ = [
    '../_base_/models/upernet_inline-swin-t.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
    '../_base_/schedules/adamw_seg_160k.py',
]
crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(num_classes=150),
    auxiliary_head=dict(num_classes=150))
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
