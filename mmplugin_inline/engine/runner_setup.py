"""The Runner and device set-up of ``tools/train.py`` and ``tools/test.py``.

Both tools serve mmdet and mmseg configs alike; the config is read by
:func:`~mmplugin_inline.tools_common.load_run_config`. The runner is the config's
``runner_type``, :class:`~mmplugin_inline.engine.SafeCheckpointRunner` by default
(:mod:`.runner`); what is here is only what the plugin's tools add to it: the check of
the run's files first, CPU DDP, and one message instead of a traceback.
"""
import torch

from mmplugin_inline.tools_common import fail


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
        fail(f'--launcher {cfg.launcher} needs GPUs; on a machine without GPUs use '
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
    """The config's ``runner_type`` (built through mmengine's ``RUNNERS``), or mmengine's
    ``Runner``: what mmdet's and mmseg's ``tools/train.py`` build."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def preflight_or_fail(cfg, mode: str) -> None:
    """Run :func:`~mmplugin_inline.engine.preflight.preflight`; fail with its message."""
    from .preflight import format_problems, preflight
    problems = preflight(cfg, mode)
    if problems:
        fail(format_problems(problems))


def build_checked_runner(cfg, mode: str, allow_unsafe: bool = False):
    """Check the files (``mode``: 'train' / 'test'), set up the device and build the
    runner: :class:`~mmplugin_inline.engine.SafeCheckpointRunner` (atomic saves, the
    checkpoint read with the plugin's policy, auto-resume from a sound checkpoint, the
    random state carried), unless the config names another ``runner_type``.

    ``allow_unsafe`` (``--allow-unsafe``) sets the runner's ``allow_unsafe`` (not the
    config, which the runner saves into the work directory); a top-level
    ``verify_hash = False`` turns off the check of published names' hashes."""
    from mmengine.logging import print_log

    from .runner import RUNNER_TYPE, SafeCheckpointRunner
    preflight_or_fail(cfg, mode)
    prepare_cpu_distributed(cfg)
    if 'runner_type' not in cfg:
        cfg.runner_type = RUNNER_TYPE
    runner = build_runner(cfg)
    if isinstance(runner, SafeCheckpointRunner):
        runner.allow_unsafe = allow_unsafe
    else:
        print_log(f'runner_type {cfg.runner_type!r} is not a {RUNNER_TYPE}: its checkpoints '
                  'are read by mmengine\'s own loader and saved in place, without the '
                  'damaged-file checks and atomic saves; subclass '
                  'mmplugin_inline.engine.SafeCheckpointRunner to keep them',
                  logger='current', level=30)
        if allow_unsafe:
            fail(f'--allow-unsafe needs a runner that reads checkpoints with the plugin\'s '
                 f'policy; runner_type {cfg.runner_type!r} is not a {RUNNER_TYPE}.')
    return runner


def run_or_fail(runner, step: str):
    """Run ``runner.<step>()`` ('train' / 'test'); a checkpoint that cannot be loaded
    (refused, damaged, not downloadable) is a message, not a traceback. A distributed
    run's process group is taken down afterwards (:func:`end_distributed`)."""
    from mmplugin_inline.weights import CheckpointError
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
