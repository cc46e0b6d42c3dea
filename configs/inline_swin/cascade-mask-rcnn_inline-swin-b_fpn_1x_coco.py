# Cascade Mask R-CNN, InLine-Swin-B backbone, FPN, 1x COCO: the InLine-Swin-T recipe
# with stochastic depth 0.3.
_base_ = './cascade-mask-rcnn_inline-swin-t_fpn_1x_coco.py'

# ImageNet-1K weights released by the InLine authors, expected at this path.
pretrained = 'checkpoints/inline_swin_b.pth'
model = dict(
    backbone=dict(arch='b', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, 512, 1024]))
