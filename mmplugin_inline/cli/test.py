"""Test (and evaluate) a detector or segmentor checkpoint with mmengine's Runner.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--show-dir DIR] [--out PATH]
                         [--cfg-options KEY=VALUE ...] [--launcher pytorch]

The metrics are logged and written to WORK_DIR/TIMESTAMP/TIMESTAMP.json. The checkpoint
is loaded with ``weights_only=True`` and an allow-list of what mmengine saves (see
``mmplugin_inline.weights``).
"""
import argparse
import warnings

# mmengine imports pkg_resources, whose deprecation notice would bury the tool's messages
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')


def parse_args(argv=None):
    from mmplugin_inline import tools_common
    parser = argparse.ArgumentParser(description='Test (and evaluate) a detector or segmentor')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the directory to save the file with the metrics')
    parser.add_argument('--out',
                        help='mmdet: dump the predictions to this .pkl file; mmseg: save the '
                             'predicted label maps into this directory')
    parser.add_argument('--show', action='store_true', help='show the predictions in a window')
    parser.add_argument('--show-dir',
                        help='save pictures of the predictions: mmdet into WORK_DIR/TIMESTAMP/'
                             'SHOW_DIR, mmseg into SHOW_DIR/vis_data/vis_image')
    parser.add_argument('--wait-time', type=float, default=2,
                        help='seconds each picture is shown with --show')
    parser.add_argument('--tta', action='store_true',
                        help='test-time augmentation (the config\'s tta_model / tta_pipeline)')
    tools_common.add_run_options(parser, 'the checkpoint')
    return tools_common.parse_run_args(parser, argv)


def enable_visualization(cfg, args, codebase: str) -> None:
    """Turn on the config's visualization hook for --show / --show-dir."""
    hook = cfg.get('default_hooks', {}).get('visualization')
    if hook is None:
        from mmplugin_inline.tools_common import fail
        fail('--show / --show-dir need a visualization hook in default_hooks (the mmdet and '
             'mmseg default runtimes have one).')
    hook['draw'] = True
    if args.show:
        hook['show'] = True
        hook['wait_time'] = args.wait_time
    if args.show_dir:
        if codebase == 'mmdet':
            hook['test_out_dir'] = args.show_dir
        else:
            cfg.visualizer['save_dir'] = args.show_dir


def enable_tta(cfg) -> None:
    """Wrap the model in the config's test-time augmentation model and pipeline."""
    from mmengine.config import ConfigDict

    from mmplugin_inline.tools_common import fail
    if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
        fail('--tta needs tta_model and tta_pipeline in the config (mmseg\'s dataset bases '
             'have them; add them to mmdet configs, see mmdet\'s tools/test.py).')
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)


def main(argv=None):
    from mmplugin_inline.utils.env_check import assert_environment
    assert_environment()
    args = parse_args(argv)

    from mmplugin_inline import tools_common
    from mmplugin_inline.engine import runner_setup

    cfg, codebase = tools_common.load_run_config(args.config, args.cfg_options, args.launcher,
                                               args.work_dir)
    cfg.load_from = args.checkpoint
    cfg.resume = False
    if args.show or args.show_dir:
        enable_visualization(cfg, args, codebase)
    if args.tta:
        enable_tta(cfg)
    if args.out is not None and codebase == 'mmseg':
        cfg.test_evaluator['output_dir'] = args.out
        cfg.test_evaluator['keep_results'] = True
    if args.out is not None and codebase == 'mmdet' and not args.out.endswith(('.pkl',
                                                                               '.pickle')):
        tools_common.fail(f'--out must name a .pkl file for mmdet configs, got {args.out}')

    runner = runner_setup.build_checked_runner(cfg, 'test', args.allow_unsafe)
    if args.out is not None and codebase == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    runner_setup.run_or_fail(runner, 'test')

