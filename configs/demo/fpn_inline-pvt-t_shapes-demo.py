# The demo of `make demo-seg`: Semantic FPN InLine-PVT-T
# (configs/inline_pvt/fpn_inline-pvt-t_8xb4-40k_ade20k-512x512.py) trained from scratch
# on the generated shapes label maps, on a CPU, in a fixed time budget. Only what the
# small data and the CPU need is changed: dataset (background counted as a class),
# image scale, schedule, batch, evaluation interval, lighter neck and head.
_base_ = '../inline_pvt/fpn_inline-pvt-t_8xb4-40k_ade20k-512x512.py'

data_root = 'data/shapes_demo/'
metainfo = dict(classes=('background', 'circle', 'square', 'triangle'),
                palette=[(0, 0, 0), (220, 20, 60), (0, 128, 255), (0, 160, 0)])
img_scale = (192, 192)
train_budget_s = 600

model = dict(
    data_preprocessor=dict(size=None, size_divisor=32),
    backbone=dict(init_cfg=None),  # no ImageNet weights here: trained from scratch
    neck=dict(out_channels=128),
    decode_head=dict(in_channels=[128, 128, 128, 128], channels=64, num_classes=4))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs'),
]
_dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo,
                reduce_zero_label=False, img_suffix='.jpg', seg_map_suffix='.png')
train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(_dataset, data_prefix=dict(img_path='images/training',
                                            seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=1, persistent_workers=True,
    dataset=dict(_dataset, data_prefix=dict(img_path='images/validation',
                                            seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=5e-4, weight_decay=0.01),
                     clip_grad=dict(_delete_=True, max_norm=1.0, norm_type=2))
param_scheduler = []
custom_hooks = [dict(type='TimeBudgetHook', budget_s=train_budget_s, warmup_iters=50)]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=5000, val_interval=250)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=100000, max_keep_ckpts=1,
                    save_last=True))
log_processor = dict(by_epoch=False)
