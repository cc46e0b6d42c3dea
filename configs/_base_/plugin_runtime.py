# What the plugin's configs add to their codebase's default_runtime: the plugin's runner,
# mmengine's Runner with atomic checkpoint saves, the run's checkpoints read with the
# plugin's policy (weights_only with mmengine's allow-list; a damaged file named as
# such), auto-resume from the newest sound checkpoint and the random state carried
# through checkpoints (mmplugin_inline.engine.SafeCheckpointRunner). mmdet's and mmseg's
# own tools/train.py build it as well: they honour runner_type. It resolves once the
# plugin is imported, which the config's custom_imports does.
runner_type = 'mmplugin_inline.SafeCheckpointRunner'
