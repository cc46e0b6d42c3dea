# UperNet, InLine-CSwin-T backbone, 160k, ADE20K 512x512: the InLine-Swin-T recipe.
_base_ = '../inline_swin/upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py'

# ImageNet-1K weights released by the InLine authors (see README, "Pretrained weights"),
# expected at this path relative to the working directory.
pretrained = 'checkpoints/inline_cswin_t.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='InLineCSWinTransformer',
        arch='t',
        split_size=(1, 2, 7, 7),
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        out_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))
# the stem's LayerNorm (stages.0.downsample.2) is not named "norm"
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'stages.0.downsample.2': dict(decay_mult=0.)}))
