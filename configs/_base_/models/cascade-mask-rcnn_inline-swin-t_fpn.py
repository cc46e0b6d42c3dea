# Cascade Mask R-CNN with an InLine-Swin-T backbone and the Swin detection recipe's box
# heads: four shared 3x3 convs (SyncBN) and one fc, GIoU loss on decoded boxes.
_base_ = 'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py'
custom_imports = dict(imports=['mmplugin_inline'], allow_failed_imports=False)

# ImageNet-1K weights released by the InLine authors (see README, "Pretrained weights"),
# expected at this path relative to the working directory.
pretrained = 'checkpoints/inline_swin_t.pth'
head_norm_cfg = dict(type='SyncBN', requires_grad=True)


box_head = dict(
    type='ConvFCBBoxHead',
    num_shared_convs=4,
    num_shared_fcs=1,
    in_channels=256,
    conv_out_channels=256,
    fc_out_channels=1024,
    roi_feat_size=7,
    num_classes=80,
    reg_class_agnostic=False,
    reg_decoded_bbox=True,
    norm_cfg=head_norm_cfg,
    loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    loss_bbox=dict(type='GIoULoss', loss_weight=10.0))
stage_stds = ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [0.033, 0.033, 0.067, 0.067])

model = dict(
    backbone=dict(
        _delete_=True,
        type='InLineSwinTransformer',
        arch='t',
        window_size=7,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        out_norm=True,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]),
    roi_head=dict(bbox_head=[
        dict(box_head, bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                                       target_stds=stds)) for stds in stage_stds
    ]))
