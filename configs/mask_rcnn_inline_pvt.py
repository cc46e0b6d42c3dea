# The short name: Mask R-CNN with an InLine-PVT-T backbone, FPN, 1x COCO.
# Same as configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py; expects the
# ImageNet-1K weights at checkpoints/inline_pvt_t.pth and COCO under data/coco/.
_base_ = './inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py'
