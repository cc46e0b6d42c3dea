# Cascade Mask R-CNN, InLine-Swin-S backbone, FPN, 1x COCO: the InLine-Swin-T recipe.
_base_ = './cascade-mask-rcnn_inline-swin-t_fpn_1x_coco.py'

# ImageNet-1K weights released by the InLine authors, expected at this path.
pretrained = 'checkpoints/inline_swin_s.pth'
model = dict(backbone=dict(arch='s', init_cfg=dict(checkpoint=pretrained)))
