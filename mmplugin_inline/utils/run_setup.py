"""What ``tools/train.py`` and ``tools/test.py`` share: the config and the device set-up.

Both tools serve mmdet and mmseg configs alike; the codebase is the config's
``default_scope``. The runner itself is mmengine's, built from the config.
"""
import os.path as osp
from typing import Optional

import torch

CODEBASES = ('mmdet', 'mmseg')


def add_common_args(parser, checkpoint_use: str) -> None:
    """The options ``tools/train.py`` and ``tools/test.py`` share (OpenMMLab's names)."""
    from mmengine.config import DictAction
    parser.add_argument('--allow-unsafe', action='store_true',
                        help=f'allow full unpickling (runs code from the file) of {checkpoint_use} '
                             'that needs more than weights_only loading with the mmengine '
                             'allow-list; only for files you trust')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of the config, KEY=VALUE (lists as key="[a,b]" '
                             'or key=a,b; no spaces)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank (torch >= 2.0) or --local_rank
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_tool_args(parser, argv=None):
    """Parse; export ``LOCAL_RANK`` for mmengine when a launcher passed it as an option."""
    import os
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def load_config(path: str, cfg_options: Optional[dict] = None, launcher: str = 'none',
                work_dir: Optional[str] = None):
    """Read a config, apply ``--cfg-options`` and choose the work directory.

    The work directory is ``work_dir`` if given, else the config's own, else
    ``./work_dirs/CONFIG_NAME`` (the OpenMMLab convention).
    """
    from mmengine.config import Config
    cfg = Config.fromfile(path)
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    return cfg


def codebase(cfg) -> str:
    """'mmdet' or 'mmseg': the codebase a config is written for (its ``default_scope``)."""
    scope = cfg.get('default_scope')
    if scope not in CODEBASES:
        fail(f"The config's default_scope is {scope!r}; these tools run configs of "
             f'{" or ".join(CODEBASES)} (inherit their default_runtime.py).')
    return scope


def _replace_norm(node, old: str, new: str) -> int:
    """Replace norm layer type ``old`` by ``new`` everywhere under ``node``; return the count."""
    count = 0
    if isinstance(node, dict):
        if node.get('type') == old:
            node['type'] = new
            count += 1
        for value in node.values():
            count += _replace_norm(value, old, new)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += _replace_norm(value, old, new)
    return count


def prepare_cpu_distributed(cfg) -> bool:
    """Let a ``--launcher pytorch`` run work on CPUs (gloo), as it does on GPUs (nccl).

    mmengine's launcher assumes CUDA (``torch.cuda.set_device``, DDP with
    ``device_ids=[LOCAL_RANK]``, nccl, SyncBN). Without a GPU this initialises the gloo
    process group from torchrun's environment, wraps the model in DDP without device ids
    and turns SyncBN into BN (SyncBN has no CPU kernel). With a GPU, or without a
    launcher, it changes nothing.

    Returns:
        bool: whether the config was adapted.
    """
    if cfg.get('launcher', 'none') == 'none' or torch.cuda.is_available():
        return False
    if cfg.launcher != 'pytorch':
        raise SystemExit(f'--launcher {cfg.launcher} needs GPUs; on a machine without GPUs use '
                         '--launcher pytorch (tools/dist_train.sh / dist_test.sh, torchrun).')
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo')  # RANK, WORLD_SIZE, MASTER_* from torchrun
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = 'gloo'
    wrapper = cfg.get('model_wrapper_cfg') or dict(
        type='MMDistributedDataParallel', broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper['device_ids'] = None  # a CPU module takes no device ids
    cfg.model_wrapper_cfg = wrapper
    _replace_norm(cfg.model, 'SyncBN', 'BN')
    return True


def build_runner(cfg):
    """mmengine's ``Runner`` from the config (or the config's ``runner_type``)."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


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


def preflight_or_fail(cfg, mode: str) -> None:
    """Run :func:`~mmplugin_inline.utils.preflight.preflight`; fail with its message."""
    from .preflight import format_problems, preflight
    problems = preflight(cfg, mode)
    if problems:
        fail(format_problems(problems))


def build_checked_runner(cfg, mode: str, allow_unsafe: bool = False):
    """Check the files (``mode``: 'train' / 'test'), set up the device, build the runner
    and make it load its checkpoint safely (see :mod:`mmplugin_inline.loading`)."""
    from mmplugin_inline.loading import guard_runner_checkpoints
    preflight_or_fail(cfg, mode)
    prepare_cpu_distributed(cfg)
    return guard_runner_checkpoints(build_runner(cfg), allow_unsafe)


def run_or_fail(runner, step: str):
    """Run ``runner.<step>()`` ('train' / 'test'); a checkpoint that cannot be loaded
    (refused, damaged, not downloadable) is a message, not a traceback. A distributed
    run's process group is taken down afterwards (:func:`end_distributed`)."""
    from mmplugin_inline.loading import CheckpointError
    try:
        return getattr(runner, step)()
    except CheckpointError as exc:
        fail(str(exc))
    finally:
        end_distributed(runner)


def end_distributed(runner) -> None:
    """Release the DDP-wrapped model and destroy the process group, if one was made,
    while the interpreter is fully alive.

    mmengine leaves both to the end of the process. The DDP reducer keeps the gloo
    process group alive, and gloo's worker threads torn down during interpreter
    finalization can abort a run that succeeded (SIGABRT, "terminate called without an
    active exception").
    """
    import gc

    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return
    runner.model = None  # the DDP wrapper and its reducer hold the process group
    gc.collect()
    dist.destroy_process_group()
