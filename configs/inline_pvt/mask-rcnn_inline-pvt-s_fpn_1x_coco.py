# Mask R-CNN, InLine-PVT-S backbone, FPN, 1x COCO: the InLine-PVT-T recipe.
_base_ = './mask-rcnn_inline-pvt-t_fpn_1x_coco.py'

# ImageNet-1K weights released by the InLine authors, expected at this path.
pretrained = 'checkpoints/inline_pvt_s.pth'
model = dict(backbone=dict(arch='s', init_cfg=dict(checkpoint=pretrained)))
