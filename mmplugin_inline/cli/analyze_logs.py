"""Curves and training speed from the json logs of runs of ``tools/train.py``.

Usage::

    python tools/analysis_tools/analyze_logs.py plot_curve LOG.json [LOG.json ...]
        [--keys loss bbox_mAP] [--out curves.png] [--title T] [--legend L ...]
        [--start-epoch 1] [--eval-interval 1] [--backend B] [--style dark]
    python tools/analysis_tools/analyze_logs.py cal_train_time LOG.json [--include-outliers]

A log is ``WORK_DIR/<timestamp>/vis_data/scalars.json`` (mmengine's LocalVisBackend;
``<timestamp>.json`` beside it holds the same lines). Which codebase wrote it is read
from the ``config.py`` saved beside it, else guessed from the log (epoch-based training
lines: mmdet, iteration-based: mmseg). ``plot_curve`` is mmdet's for mmdet runs (metrics
by epoch; ``coco/bbox_mAP`` may be given as ``bbox_mAP``) and mmseg's for mmseg runs
(metrics by iteration; default key ``mIoU``). ``cal_train_time`` is mmdet's (mmseg ships
none) and reads only the training lines, so validation iterations of either codebase
do not count; an iteration-based run is one "epoch".

Fixes to those scripts: seaborn, which both import only for ``set_style``, is not a
dependency of the stack: when it is missing matplotlib's own ``seaborn-v0_8-<style>``
sheet is used instead. Without ``--out`` the figure is shown; without a display that is
an error that asks for ``--out`` (matplotlib would silently draw nothing).
"""
import argparse
import json
import os
import os.path as osp
import sys
import tempfile
import types

from mmplugin_inline.utils.env_check import assert_environment


def _matplotlib_seaborn():
    """A stand-in for ``seaborn`` with the one function the scripts call."""
    def set_style(style='dark', rc=None):
        import matplotlib.pyplot as plt
        sheet = f'seaborn-v0_8-{style}'
        if sheet in plt.style.available:
            plt.style.use(sheet)
    return types.SimpleNamespace(set_style=set_style, __name__='seaborn')


def read_log(path):
    """The json lines of a log (a message names a missing or unreadable file)."""
    from mmplugin_inline.analysis.scalars import ScalarsError, read_scalars_file
    from mmplugin_inline.tools_common import fail
    if not osp.isfile(path):
        fail(f'Log not found: {path}. Training writes it to '
             'WORK_DIR/<timestamp>/vis_data/scalars.json.')
    try:
        lines = read_scalars_file(path)
    except ScalarsError as exc:
        fail(f'{exc}: give the json log of a run (vis_data/scalars.json), not the text log.')
    if not any('lr' in line for line in lines):
        fail(f'{path} has no training lines (with "lr"): is it the log of a training run?')
    return lines


def codebase_of_log(path, lines) -> str:
    """'mmdet' or 'mmseg': the config saved beside the log, else the log's shape."""
    from mmengine.config import Config

    from mmplugin_inline.tools_common import codebase_of
    config = osp.join(osp.dirname(osp.abspath(path)), 'config.py')
    if osp.isfile(config):
        try:
            return codebase_of(Config.fromfile(config))
        except Exception:  # noqa: BLE001 - a dump that no longer loads: guess from the log
            pass
    return 'mmdet' if any('epoch' in line for line in lines if 'lr' in line) else 'mmseg'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Analyse the json logs of training runs')
    sub = parser.add_subparsers(dest='task', required=True)
    plot = sub.add_parser('plot_curve', help='plot losses / metrics over the run')
    plot.add_argument('json_logs', nargs='+', help='json logs (vis_data/scalars.json)')
    plot.add_argument('--keys', nargs='+', default=None,
                      help='what to plot (default: bbox_mAP for mmdet runs, mIoU for mmseg)')
    plot.add_argument('--start-epoch', default='1', help='mmdet: the first epoch plotted')
    plot.add_argument('--eval-interval', default='1',
                      help='mmdet: the validation interval of the run, in epochs')
    plot.add_argument('--title', help='title of the figure')
    plot.add_argument('--legend', nargs='+', default=None,
                      help='one per log and key (default LOG_KEY)')
    plot.add_argument('--backend', default=None, help='matplotlib backend')
    plot.add_argument('--style', default='dark', help='seaborn style')
    plot.add_argument('--out', default=None, help='save the figure there instead of showing it')
    time = sub.add_parser('cal_train_time', help='seconds per training iteration')
    time.add_argument('json_logs', nargs='+', help='json logs (vis_data/scalars.json)')
    time.add_argument('--include-outliers', action='store_true',
                      help='count the first iteration of each epoch too')
    return parser.parse_args(argv)


def main(argv=None):
    assert_environment()
    from mmplugin_inline import tools_common
    args = parse_args(argv)
    logs = {path: read_log(path) for path in args.json_logs}
    codebases = {codebase_of_log(path, lines) for path, lines in logs.items()}
    if len(codebases) > 1:
        tools_common.fail('The logs come from both mmdet and mmseg runs; analyse them separately.')
    codebase = codebases.pop()
    if args.task == 'cal_train_time':
        codebase = 'mmdet'  # mmseg ships no cal_train_time
    try:
        import seaborn  # noqa: F401
        stand_in = False
    except ImportError:  # only for the script's import: no one else sees the stand-in
        sys.modules['seaborn'] = stand_in = _matplotlib_seaborn()
    try:
        script = tools_common.codebase_script(codebase, 'analysis_tools/analyze_logs.py')
    finally:
        if stand_in:
            del sys.modules['seaborn']
    if args.task == 'cal_train_time':
        with tempfile.TemporaryDirectory() as tmp:
            train_only = []
            for i, lines in enumerate(logs.values()):
                train_only.append(osp.join(tmp, f'{i}.json'))
                with open(train_only[-1], 'w') as f:
                    f.writelines(json.dumps(line) + '\n' for line in lines if 'lr' in line)
            log_dicts = script.load_json_logs(train_only)
        try:
            script.cal_train_time(log_dicts, args)
        except (KeyError, ValueError) as exc:
            tools_common.fail(f'cal_train_time: {exc}. Each epoch needs at least two logged '
                            'iterations (lower default_hooks.logger.interval) or give '
                            '--include-outliers.')
        return log_dicts
    if args.out is None and not tools_common.display_available() and args.backend is None:
        tools_common.fail('No display to show the figure on: give --out FILE.png to save it.')
    if args.keys is None:
        args.keys = ['bbox_mAP'] if codebase == 'mmdet' else ['mIoU']
    if codebase == 'mmdet':  # its loader keeps the part after the last '/'
        args.keys = [key.split('/')[-1] for key in args.keys]
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    if args.legend is not None and len(args.legend) != len(args.json_logs) * len(args.keys):
        tools_common.fail(f'--legend needs one entry per log and key: '
                        f'{len(args.json_logs)} x {len(args.keys)}, got {len(args.legend)}.')
    log_dicts = script.load_json_logs(args.json_logs)
    try:
        script.plot_curve(log_dicts, args)
    except KeyError as exc:
        tools_common.fail(f'plot_curve: {exc.args[0] if exc.args else exc}')
    return log_dicts

