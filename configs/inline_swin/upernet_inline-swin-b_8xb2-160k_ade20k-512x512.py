# UperNet, InLine-Swin-B backbone, 160k, ADE20K 512x512: the InLine-Swin-T recipe.
_base_ = './upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py'

# ImageNet-1K weights released by the InLine authors, expected at this path.
pretrained = 'checkpoints/inline_swin_b.pth'
model = dict(
    backbone=dict(arch='b', init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
