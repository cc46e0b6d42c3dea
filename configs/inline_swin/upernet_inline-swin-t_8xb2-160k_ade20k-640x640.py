# UperNet, InLine-Swin-T backbone, 160k iterations, ADE20K at 640x640 (crops of 640,
# testing with the shorter side at 640): the higher-resolution variant of the
# 512x512 recipe. InLine blocks attend over the whole map at linear cost.
_base_ = [
    '../_base_/models/upernet_inline-swin-t.py',
    'mmseg::_base_/datasets/ade20k_640x640.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/plugin_runtime.py',
    '../_base_/schedules/adamw_seg_160k.py',
]
crop_size = (640, 640)
model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(num_classes=150),
    auxiliary_head=dict(num_classes=150))
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
