"""Command-line pieces shared by get_flops, benchmark and image_demo."""
import argparse
import os.path as osp

SHAPE_HELP = ('input H W (or one size S for S x S); default 800 1333 for mmdet configs, '
              '512 512 for mmseg configs')


def add_model_options(parser: argparse.ArgumentParser, shape: bool = True) -> None:
    """``--shape`` (optional), ``--device`` and ``--cfg-options``."""
    from mmengine.config import DictAction
    if shape:
        parser.add_argument('--shape', type=int, nargs='+', default=None, metavar='SIZE',
                            help=SHAPE_HELP)
    parser.add_argument('--device', default='cpu', help='cpu or cuda (cuda:N)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of the config, KEY=VALUE (mmengine syntax)')


def require_file(path: str, what: str = 'config file') -> str:
    """Exit with one line naming ``path`` when it is not a file."""
    if not osp.isfile(path):
        raise SystemExit(f'{what} not found: {path}')
    return path
