"""Print the whole config (bases merged, ``--cfg-options`` applied), optionally save it.

Usage::

    python tools/misc/print_config.py CONFIG [--save-path FILE.py|.json|.yml]
        [--cfg-options KEY=VALUE ...]

mmdet configs go to mmdet's own ``tools/misc/print_config.py`` (which also resolves
``${key}`` references), mmseg configs to mmseg's. The
plugin is imported first (the configs' ``custom_imports``), so a config that names an
InLine backbone is checked to load before anything is printed.

Differences from running those scripts directly: ``--save-path`` may be a bare file
name (mmdet's crashes creating the folder ''), its suffix is checked with a message
instead of an assert, and mmseg's script, which always writes ``example.py`` into the
working directory, runs in a temporary one (``--save-path`` writes the dump instead).
``MMDET_DATASETS`` is ignored, with a note, as mmdet 3.3's own train and test do: its
``update_data_root``, which mmdet's print_config calls, reads the ``data`` section of
2.x configs and stops with ``AttributeError: ... no attribute 'data'`` on 3.x ones.
"""
import argparse
import os
import os.path as osp
import tempfile
from types import SimpleNamespace

from mmplugin_inline.utils.env_check import assert_environment

SUFFIXES = ('.py', '.json', '.yml', '.yaml')


def _ignore_mmdet_datasets(cfg, logger=None):
    """What replaces mmdet's ``update_data_root`` (2.x configs only): a note if set."""
    if 'MMDET_DATASETS' in os.environ:
        print(f'Note: MMDET_DATASETS={os.environ["MMDET_DATASETS"]} is ignored, as by '
              'mmdet 3.x train and test; override the data root with --cfg-options.')


def parse_args(argv=None):
    from mmplugin_inline.tools_common import add_cfg_options
    parser = argparse.ArgumentParser(description='Print the whole config')
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('--save-path', default=None,
                        help=f'also save the whole config there ({", ".join(SUFFIXES)})')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def main(argv=None):
    assert_environment()
    from mmplugin_inline import tools_common
    args = parse_args(argv)
    cfg, codebase = tools_common.load_tool_config(args.config, args.cfg_options)
    save_path = args.save_path and osp.abspath(args.save_path)
    if save_path and osp.splitext(save_path)[1] not in SUFFIXES:
        tools_common.fail(f'--save-path must end with {", ".join(SUFFIXES)}, got {args.save_path}')
    script = tools_common.codebase_script(codebase, 'misc/print_config.py')
    theirs = SimpleNamespace(config=osp.abspath(args.config), cfg_options=args.cfg_options,
                             save_path=save_path, graph=False, options=None)
    script.parse_args = lambda: theirs
    if codebase == 'mmdet':
        script.update_data_root = _ignore_mmdet_datasets
        script.main()
    else:
        cwd = os.getcwd()
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)  # its unconditional example.py dump lands here
            try:
                script.main()
            finally:
                os.chdir(cwd)
        if save_path:
            os.makedirs(osp.dirname(save_path), exist_ok=True)
            cfg.dump(save_path)
            print(f'Config saved at {save_path}')
    return cfg

