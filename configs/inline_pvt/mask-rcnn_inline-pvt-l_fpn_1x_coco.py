# Mask R-CNN, InLine-PVT-L backbone, FPN, 1x COCO: the InLine-PVT-T recipe.
_base_ = './mask-rcnn_inline-pvt-t_fpn_1x_coco.py'

# ImageNet-1K weights released by the InLine authors, expected at this path.
pretrained = 'checkpoints/inline_pvt_l.pth'
model = dict(backbone=dict(arch='l', init_cfg=dict(checkpoint=pretrained)))
