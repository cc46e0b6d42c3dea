"""Train a detector (mmdet config) or a segmentor (mmseg config) with mmengine's Runner.

    python tools/train.py CONFIG [--work-dir DIR] [--amp] [--resume [CHECKPOINT]]
                          [--cfg-options KEY=VALUE ...] [--launcher pytorch]

Before anything heavy it checks that the data, the pretrained weights and the
checkpoint to resume from exist, and says how to get what is missing. ``--resume`` and
``load_from`` load the run's own checkpoints with ``weights_only=True`` and an
allow-list of what mmengine saves (see ``mmplugin_inline.weights``).
"""
import argparse
import warnings

# mmengine imports pkg_resources, whose deprecation notice would bury the tool's messages
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')


def parse_args(argv=None):
    from mmplugin_inline import tools_common
    parser = argparse.ArgumentParser(description='Train a detector or segmentor')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the directory to save logs and checkpoints')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision training (needs a GPU)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by the actual batch size (mmdet configs '
                             'with auto_scale_lr)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from this checkpoint, or, without a path, from the latest '
                             'checkpoint in the work directory')
    tools_common.add_run_options(parser, 'a resume / load_from checkpoint')
    return tools_common.parse_run_args(parser, argv)


def main(argv=None):
    from mmplugin_inline.utils.env_check import assert_environment
    assert_environment()  # a broken stack is explained before mmdet / mmseg are imported
    args = parse_args(argv)

    import torch

    from mmplugin_inline import tools_common
    from mmplugin_inline.engine import runner_setup

    cfg, _ = tools_common.load_run_config(args.config, args.cfg_options, args.launcher,
                                        args.work_dir)

    if args.amp:
        if not torch.cuda.is_available():
            tools_common.fail('--amp (mixed precision) needs a GPU: mmengine\'s AmpOptimWrapper '
                           'does not run on CPU. Drop --amp to train in fp32.')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.loss_scale = 'dynamic'
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            tools_common.fail('--auto-scale-lr needs auto_scale_lr = dict(base_batch_size=N) in '
                           'the config (mmdet configs have it).')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':  # the latest checkpoint of the work directory
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume

    runner = runner_setup.build_checked_runner(cfg, 'train', args.allow_unsafe)
    runner_setup.run_or_fail(runner, 'train')

