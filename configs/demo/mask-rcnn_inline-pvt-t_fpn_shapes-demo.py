# The demo of `make demo`: Mask R-CNN InLine-PVT-T (configs/mask_rcnn_inline_pvt.py)
# trained from scratch on the generated shapes data, on a CPU, in a fixed time budget.
# Only what the small data and the CPU need is changed: dataset, image scale,
# schedule, batch, evaluation interval, and a lighter head (FPN 128 channels, fewer
# proposals) so that the 2-core run fits in about 15 minutes.
_base_ = '../mask_rcnn_inline_pvt.py'

data_root = 'data/shapes_demo/'
metainfo = dict(classes=('circle', 'square', 'triangle'),
                palette=[(220, 20, 60), (0, 128, 255), (0, 160, 0)])
img_scale = (192, 192)
train_budget_s = 800  # seconds of training (intermediate validations included)

model = dict(
    backbone=dict(init_cfg=None),  # no ImageNet weights here: trained from scratch
    neck=dict(out_channels=128),
    rpn_head=dict(in_channels=128, feat_channels=128),
    roi_head=dict(
        # a fixed 2x2 samples per RoIAlign bin (Detectron's choice) instead of adaptive:
        # mmcv's CPU RoIAlign (backward above all) took ~40% of an iteration here
        bbox_roi_extractor=dict(out_channels=128, roi_layer=dict(sampling_ratio=2)),
        bbox_head=dict(in_channels=128, num_classes=3),
        mask_roi_extractor=dict(out_channels=128, roi_layer=dict(sampling_ratio=2)),
        mask_head=dict(in_channels=128, conv_out_channels=128, num_classes=3)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=200),
        rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(
        rpn=dict(nms_pre=500, max_per_img=100),
        rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=2, num_workers=1, persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_training.json',
                 data_prefix=dict(img='images/training/'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_validation.json',
                 data_prefix=dict(img='images/validation/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_validation.json',
                     metric=['bbox', 'segm'])
test_evaluator = val_evaluator

# AdamW as in the base recipe, with the learning rate a from-scratch run on this data
# needs; warm-up then a cosine decay over *time* that ends with the budget.
optim_wrapper = dict(
    optimizer=dict(lr=5e-4, weight_decay=0.05, foreach=True),  # one fused step, not a loop
    clip_grad=dict(max_norm=1.0, norm_type=2))
param_scheduler = []
custom_hooks = [dict(type="TimeBudgetHook", budget_s=train_budget_s, warmup_iters=100)]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=5000, val_interval=250)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),  # val at its iteration
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=100000, max_keep_ckpts=1,
                    save_last=True))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False)
