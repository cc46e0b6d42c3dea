"""Draw the ground truth of a config's training set: boxes and masks (mmdet) or label
overlays (mmseg), after the training pipeline (augmentations included).

Usage::

    python tools/misc/browse_dataset.py CONFIG [--output-dir DIR] [--not-show]
        [--show-interval SECONDS] [--cfg-options KEY=VALUE ...]

The work is done by the installed codebase's own ``tools/analysis_tools/browse_dataset.py``
(mmdet's for mmdet configs, mmseg's for mmseg ones), after the plugin is imported (the
config's ``custom_imports``). Pictures are shown in a window unless ``--not-show``, and
written to ``DIR/<image name>`` with ``--output-dir``. Without a display (``DISPLAY``
unset, as on servers and in CI) nothing is shown, the tool says so and only writes the
pictures; it then needs ``--output-dir`` (mmengine's window would wait forever).

One fix to mmseg's script: it hands the visualizer a strided (non-contiguous) view of
the image, on which OpenCV refuses to draw the class names (``cv2.error: Layout of the
output array img is incompatible with cv::Mat``); the images are made contiguous on the
way to ``add_datasample``.
"""
import argparse
import os.path as osp
from types import SimpleNamespace

from mmplugin_inline.utils.env_check import assert_environment


def _contiguous_images(visualizers):
    """``visualizers`` (a registry) whose visualizers get C-contiguous images."""
    import numpy as np

    def build(cfg):
        visualizer = visualizers.build(cfg)
        draw = visualizer.add_datasample

        def add_datasample(*args, **kwargs):
            if 'image' in kwargs:
                kwargs['image'] = np.ascontiguousarray(kwargs['image'])
            else:
                args = args[:1] + (np.ascontiguousarray(args[1]),) + args[2:]
            return draw(*args, **kwargs)
        visualizer.add_datasample = add_datasample
        return visualizer
    return SimpleNamespace(build=build)


def parse_args(argv=None):
    from mmplugin_inline.tools_common import add_cfg_options
    parser = argparse.ArgumentParser(description='Draw the ground truth of the training set')
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('--output-dir', default=None,
                        help='write the pictures there (needed without a display)')
    parser.add_argument('--not-show', action='store_true', help='do not open a window')
    parser.add_argument('--show-interval', type=float, default=2,
                        help='seconds each picture is shown')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def main(argv=None):
    assert_environment()
    from mmplugin_inline import tools_common
    args = parse_args(argv)
    _, codebase = tools_common.load_tool_config(args.config, args.cfg_options)
    out_dir = args.output_dir and osp.abspath(args.output_dir)
    show = tools_common.can_show(not args.not_show,
                               f'the pictures are written to {out_dir}' if out_dir else
                               'nothing to do without --output-dir')
    if not show and not out_dir:
        tools_common.fail('Nothing to do: no window (no display or --not-show) and no '
                        '--output-dir. Give --output-dir DIR to write the pictures.')
    script = tools_common.codebase_script(codebase, 'analysis_tools/browse_dataset.py')
    script.VISUALIZERS = _contiguous_images(script.VISUALIZERS)
    script.parse_args = lambda: SimpleNamespace(
        config=args.config, output_dir=out_dir, not_show=not show,
        show_interval=args.show_interval, cfg_options=args.cfg_options)
    script.main()
    return out_dir

