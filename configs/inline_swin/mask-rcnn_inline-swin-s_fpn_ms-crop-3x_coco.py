# Mask R-CNN, InLine-Swin-S backbone, FPN, ms-crop-3x COCO: the InLine-Swin-T recipe.
_base_ = './mask-rcnn_inline-swin-t_fpn_ms-crop-3x_coco.py'

# ImageNet-1K weights released by the InLine authors, expected at this path.
pretrained = 'checkpoints/inline_swin_s.pth'
model = dict(backbone=dict(arch='s', init_cfg=dict(checkpoint=pretrained)))
