# Semantic FPN, InLine-PVT-S backbone, 40k, ADE20K 512x512: the InLine-PVT-T recipe.
_base_ = './fpn_inline-pvt-t_8xb4-40k_ade20k-512x512.py'

# ImageNet-1K weights released by the InLine authors, expected at this path.
pretrained = 'checkpoints/inline_pvt_s.pth'
model = dict(backbone=dict(arch='s', init_cfg=dict(checkpoint=pretrained)))
