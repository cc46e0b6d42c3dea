# The Swin detection recipe, 3x: as 1x (AdamW lr 1e-4, weight decay 0.05 except on norms
# and position tables) for 36 epochs with steps at 27 and 33.
_base_ = './adamw_det_1x.py'

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1)
]
