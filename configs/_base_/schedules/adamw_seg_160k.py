# The Swin / ViT segmentation recipe: AdamW lr 6e-5, weight decay 0.01 except on norms
# and position tables, 1500-iteration linear warm-up, then poly decay (power 1) to 0
# over 160k iterations. Batch 16 (8 GPUs x 2 images).
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={
        'pos_embed': dict(decay_mult=0.),
        'cls_token': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
    }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
