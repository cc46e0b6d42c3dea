"""The Runner and device set-up of ``tools/train.py`` and ``tools/test.py``.

Both tools serve mmdet and mmseg configs alike; the config is read by
:func:`~mmplugin_inline.tools_common.load_run_config`. The runner itself is
mmengine's, built from the config.
"""
import os
import os.path as osp
import re

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
    """mmengine's ``Runner`` from the config (or the config's ``runner_type``)."""
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


_CHECKPOINT_NAME = re.compile(r'^(?:iter|epoch)_(\d+)\.pth$')


def latest_sound_checkpoint(work_dir: str):
    """The checkpoint an automatic resume should start from, or None.

    mmengine's own choice is whatever ``WORK_DIR/last_checkpoint`` names. That file is
    written after the checkpoint, so a run killed while saving leaves it naming the
    previous one; but an old checkpoint may have been deleted (``max_keep_ckpts``)
    before the new one was written, or the file named may be damaged (a copy, a full
    disk, a save by another tool that is not atomic). This takes the named file if it
    is sound, else the most recent sound ``iter_N.pth`` / ``epoch_N.pth`` beside it.

    Returns:
        tuple: ``(path or None, [(skipped path, why), ...])``.
    """
    from mmplugin_inline.weights import damage_of
    named = None
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip() or None
    candidates = [named] if named else []
    for folder in dict.fromkeys([osp.dirname(named) if named else work_dir, work_dir]):
        if osp.isdir(folder):
            found = [osp.join(folder, n) for n in os.listdir(folder) if _CHECKPOINT_NAME.match(n)]
            candidates += sorted(found, key=lambda p: (osp.getmtime(p), p), reverse=True)
    skipped = []
    for path in dict.fromkeys(candidates):
        if not osp.isfile(path):
            skipped.append((path, 'is named by last_checkpoint but does not exist'))
            continue
        why = damage_of(path)
        if why is None:
            return path, skipped
        skipped.append((path, why))
    return None, skipped


def choose_auto_resume(cfg) -> None:
    """``resume=True`` without ``load_from``: resume from :func:`latest_sound_checkpoint`
    (set as ``load_from``), or start afresh if the work directory holds none; log the
    files passed over."""
    from mmengine.logging import print_log
    if not cfg.get('resume') or cfg.get('load_from') or not cfg.get('work_dir'):
        return
    path, skipped = latest_sound_checkpoint(cfg.work_dir)
    for bad, why in skipped:
        print_log(f'Auto-resume: skipping {bad}: it {why}', logger='current', level=30)
    if path is None:
        if skipped:
            print_log(f'Auto-resume: no complete checkpoint in {cfg.work_dir}; training '
                      'starts afresh', logger='current', level=30)
        cfg.resume = False
    else:
        cfg.load_from = path


def add_default_hooks(cfg) -> None:
    """Add :class:`~mmplugin_inline.engine.RandomStateHook` to ``custom_hooks`` (once)."""
    hooks = list(cfg.get('custom_hooks') or [])
    if not any(str(h.get('type', '')).endswith('RandomStateHook') for h in hooks):
        hooks.append(dict(type='mmplugin_inline.RandomStateHook'))
    cfg.custom_hooks = hooks


def atomic_checkpoint_saves(runner):
    """Make ``runner`` write its checkpoints to ``NAME.part`` and rename them to ``NAME``
    once complete (local directories), so a process killed while saving never leaves a
    truncated file under a checkpoint's name. Returns the runner."""
    from mmengine.dist import is_main_process
    original = runner.save_checkpoint

    def save_checkpoint(out_dir, filename, *args, **kwargs):
        local = '://' not in str(out_dir) and not kwargs.get('backend_args') and \
            not (args and args[0]) and not kwargs.get('file_client_args')
        if not local:
            return original(out_dir, filename, *args, **kwargs)
        partial = filename + '.part'
        original(out_dir, partial, *args, **kwargs)
        if is_main_process():  # mmengine's save writes on rank 0 only
            path = osp.join(out_dir, partial)
            with open(path, 'rb+') as f:
                os.fsync(f.fileno())
            os.replace(path, osp.join(out_dir, filename))

    runner.save_checkpoint = save_checkpoint
    return runner


def build_checked_runner(cfg, mode: str, allow_unsafe: bool = False):
    """Check the files (``mode``: 'train' / 'test'), set up the device, build the runner
    and make it load its checkpoint safely (see :mod:`mmplugin_inline.weights`).

    For training it also picks the checkpoint of an automatic resume
    (:func:`choose_auto_resume`), adds :class:`~mmplugin_inline.engine.RandomStateHook`
    and makes checkpoint saves atomic (:func:`atomic_checkpoint_saves`)."""
    from mmplugin_inline.weights import guard_runner_checkpoints
    if mode == 'train':
        choose_auto_resume(cfg)
        add_default_hooks(cfg)
    preflight_or_fail(cfg, mode)
    prepare_cpu_distributed(cfg)
    # a top-level ``verify_hash = False`` turns off the check of published names' hashes
    runner = guard_runner_checkpoints(build_runner(cfg), allow_unsafe,
                                      verify_hash=cfg.get('verify_hash', True))
    return atomic_checkpoint_saves(runner) if mode == 'train' else runner


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
