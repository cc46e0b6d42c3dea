# The Swin detection recipe, 1x: AdamW lr 1e-4, weight decay 0.05 except on norms and
# position tables, 1000-iteration linear warm-up, 12 epochs with steps at 8 and 11.
# Batch 16 (8 GPUs x 2 images).
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1)
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999),
                   weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={
        'pos_embed': dict(decay_mult=0.),
        'cls_token': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
    }))
