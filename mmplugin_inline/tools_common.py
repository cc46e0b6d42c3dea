"""What the command-line tools share: config loading, codebase detection, the shared
command-line options and the failure messages.

Used by the tools' modules in :mod:`mmplugin_inline.cli` (train, test, get_flops,
benchmark, confusion_matrix, analyze_logs, image_demo, demo_report, print_config,
browse_dataset, pytorch2onnx) and by :mod:`mmplugin_inline.analysis`, so that a
config is read, overridden (``--cfg-options``) and attributed to mmdet or mmseg the
same way by all of them, and a missing file or an unusable config ends every tool
with the same one-line message (status 1, no traceback). ``codebase_script`` finds the
scripts mmdet's and mmseg's wheels ship, for the tools that delegate to them, and
``can_show`` keeps ``--show`` from waiting on a window that a headless machine cannot
open.

The ``add_*_options`` helpers add options to a parser a tool's module made (no parser is
made or parsed here, and argparse is not imported); ``DictAction`` is imported when they
are called, not when this module is.
"""
import copy
import importlib
import os.path as osp
from typing import Optional, Tuple

#: the codebases whose configs the tools run (their ``default_scope``)
CODEBASES = ('mmdet', 'mmseg')
SHAPE_HELP = ('input H W (or one size S for S x S); default 800 1333 for mmdet configs, '
              '512 512 for mmseg configs')


class CodebaseError(ValueError):
    """A config that is neither recognisably mmdet's nor mmseg's."""


def fail(message: str, stream=None) -> None:
    """End the tool with ``message`` on stderr and status 1, without a stack trace."""
    import sys
    print(message, file=stream or sys.stderr, flush=True)
    raise SystemExit(1)


def check_config_path(path: str) -> None:
    """Fail with a message when the config file does not exist."""
    if not osp.isfile(path):
        fail(f'Config file not found: {path} ({osp.abspath(path)}). The configs of this plugin '
             'are under configs/, e.g. configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py.')


def load_config(config, cfg_options: Optional[dict] = None):
    """A :class:`~mmengine.config.Config` from a path, a Config or a dict; ``cfg_options``
    (``--cfg-options``) merged in.

    ``custom_imports`` are imported also for configs that did not come from a file
    (``Config.fromfile`` does it for files), so the plugin's models are registered.
    """
    from mmengine.config import Config
    if isinstance(config, Config):
        cfg = copy.deepcopy(config)  # merging options must not change the caller's
    elif isinstance(config, dict):
        cfg = Config(config)
    else:
        cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    imports = cfg.get('custom_imports')
    if imports:
        from mmengine.utils import import_modules_from_strings
        import_modules_from_strings(**imports)
    return cfg


def codebase_of(cfg) -> str:
    """'mmdet' or 'mmseg': the config's ``default_scope``, else the codebase whose
    registry has the model type (when exactly one has it).

    Raises:
        CodebaseError: when neither tells.
    """
    scope = cfg.get('default_scope')
    if scope in CODEBASES:
        return scope
    model_type = cfg.get('model', {}).get('type')
    found = []
    for name in CODEBASES:
        registry = importlib.import_module(f'{name}.registry').MODELS
        if isinstance(model_type, str) and registry.get(model_type) is not None:
            found.append(name)
    if len(found) == 1:
        return found[0]
    raise CodebaseError(
        f'Cannot tell whether the config is for mmdet or mmseg: default_scope is {scope!r} '
        f'and the model type {model_type!r} is registered in {found or "neither"}; set '
        "default_scope = 'mmdet' or 'mmseg' (inherit their default_runtime.py).")


def load_tool_config(path: str, cfg_options: Optional[dict] = None) -> Tuple[object, str]:
    """The config at ``path`` with ``cfg_options`` and its codebase, for a tool's ``main``:
    a missing file or a config of neither codebase ends the tool with a message."""
    check_config_path(path)
    cfg = load_config(path, cfg_options)
    try:
        return cfg, codebase_of(cfg)
    except CodebaseError as exc:
        fail(str(exc))


def load_run_config(path: str, cfg_options: Optional[dict] = None, launcher: str = 'none',
                    work_dir: Optional[str] = None) -> Tuple[object, str]:
    """:func:`load_tool_config` for a run of mmengine's Runner (``tools/train.py``,
    ``tools/test.py``): also the launcher, the scope and the work directory.

    ``--cfg-options`` may override the launcher, as in mmdet's tools. The scope is set
    to the codebase (it was inferred if the config had none), so the Runner builds
    from that codebase's registries. The work directory is ``work_dir`` if given, else
    the config's own, else ``./work_dirs/CONFIG_NAME`` (the OpenMMLab convention).
    """
    cfg, codebase = load_tool_config(path, {'launcher': launcher, **(cfg_options or {})})
    cfg.default_scope = codebase
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    return cfg, codebase


def add_cfg_options(parser) -> None:
    """``--cfg-options KEY=VALUE ...`` (mmengine's ``DictAction``), read by
    :func:`load_config`."""
    from mmengine.config import DictAction
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of the config, KEY=VALUE (lists as key="[a,b]" '
                             'or key=a,b; no spaces)')


def add_run_options(parser, checkpoint_use: str) -> None:
    """The options ``tools/train.py`` and ``tools/test.py`` share (OpenMMLab's names)."""
    parser.add_argument('--allow-unsafe', action='store_true',
                        help=f'allow full unpickling (runs code from the file) of {checkpoint_use} '
                             'that needs more than weights_only loading with the mmengine '
                             'allow-list; only for files you trust')
    add_cfg_options(parser)
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank (torch >= 2.0) or --local_rank
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_run_args(parser, argv=None):
    """Parse the options of :func:`add_run_options`; export ``LOCAL_RANK`` for mmengine
    when a launcher passed it as an option."""
    import os
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def add_model_options(parser, shape: bool = True) -> None:
    """``--shape`` (optional), ``--device`` and ``--cfg-options``: the options of the tools
    that build a model from a config (get_flops, benchmark, image_demo)."""
    if shape:
        parser.add_argument('--shape', type=int, nargs='+', default=None, metavar='SIZE',
                            help=SHAPE_HELP)
    parser.add_argument('--device', default='cpu', help='cpu or cuda (cuda:N)')
    add_cfg_options(parser)


def display_available() -> bool:
    """Whether windows can be opened: on Linux a ``DISPLAY`` or ``WAYLAND_DISPLAY``
    (elsewhere assumed), and a matplotlib backend that is not a file-only one."""
    import os
    import sys
    if sys.platform.startswith('linux') and not (os.environ.get('DISPLAY')
                                                 or os.environ.get('WAYLAND_DISPLAY')):
        return False
    import matplotlib
    return matplotlib.get_backend().lower() not in ('agg', 'pdf', 'ps', 'svg', 'cairo',
                                                    'template')


def can_show(show: bool, instead: str) -> bool:
    """``show`` if a window can be opened; otherwise False, after saying so (a
    matplotlib or mmengine window on a headless machine would wait forever).

    ``instead`` says what the tool does without the window, e.g. 'the pictures are
    saved to out/'.
    """
    if show and not display_available():
        print(f'No display (DISPLAY is not set or matplotlib cannot open windows): not '
              f'showing; {instead}.', flush=True)
        return False
    return show


def codebase_script(codebase: str, relpath: str):
    """The script ``tools/RELPATH`` that the installed ``codebase`` ships (the wheels of
    mmdet 3.x and mmseg 1.x keep their tools under ``<package>/.mim/tools/``), imported
    as a module; a missing script ends the tool with a message."""
    import importlib.util
    spec = importlib.util.find_spec(codebase)
    roots = list(spec.submodule_search_locations or []) if spec else []
    candidates = [osp.join(root, '.mim', 'tools', relpath) for root in roots]
    # an editable (source) install keeps them in the repository's tools/
    candidates += [osp.join(osp.dirname(root), 'tools', relpath) for root in roots]
    for path in candidates:
        if osp.isfile(path):
            name = f'_{codebase}_tools_' + relpath[:-3].replace('/', '_')
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            return module
    package = 'mmsegmentation' if codebase == 'mmseg' else codebase
    fail(f'The installed {codebase} does not ship tools/{relpath} (looked in '
         f'{", ".join(candidates) or "nowhere: " + codebase + " is not installed"}); install '
         f'{codebase} from its wheel (pip install {package}).')
