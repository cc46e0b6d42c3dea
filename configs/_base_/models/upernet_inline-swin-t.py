# UperNet with an InLine-Swin-T backbone (mmseg's UperNet Swin otherwise).
_base_ = 'mmseg::_base_/models/upernet_swin.py'
custom_imports = dict(imports=['mmplugin_inline'], allow_failed_imports=False)

# ImageNet-1K weights released by the InLine authors (see README, "Pretrained weights"),
# expected at this path relative to the working directory.
pretrained = 'checkpoints/inline_swin_t.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='InLineSwinTransformer',
        arch='t',
        window_size=7,
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        out_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
