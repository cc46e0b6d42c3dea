"""The plugin's runner: mmengine's ``Runner`` with the plugin's guarantees for the run's
checkpoints, selected by ``runner_type`` (``configs/_base_/plugin_runtime.py``), so that
mmdet's and mmseg's own ``tools/train.py`` (and mmdet's ``tools/test.py``), which build a
config's ``runner_type``, give them too."""
import copy
import os
import os.path as osp
import re
from typing import List, Optional, Tuple

from mmengine.dist import is_main_process
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

from mmplugin_inline.registry import RUNNERS
from mmplugin_inline.weights import damage_of, mmengine_checkpoint_loading

from .legacy_resume import upgrade_optimizer_state

#: the ``runner_type`` that selects :class:`SafeCheckpointRunner`, from any scope
RUNNER_TYPE = 'mmplugin_inline.SafeCheckpointRunner'

_CHECKPOINT_NAME = re.compile(r'^(?:iter|epoch)_(\d+)\.pth$')


def latest_sound_checkpoint(work_dir: str) -> Tuple[Optional[str], List[Tuple[str, str]]]:
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


def add_random_state_hook(cfg) -> None:
    """Add :class:`~mmplugin_inline.engine.RandomStateHook` to ``custom_hooks`` (once)."""
    hooks = list(cfg.get('custom_hooks') or [])
    if not any(str(h.get('type', '')).endswith('RandomStateHook') for h in hooks):
        hooks.append(dict(type='mmplugin_inline.RandomStateHook'))
    cfg.custom_hooks = hooks


@RUNNERS.register_module()
class SafeCheckpointRunner(Runner):
    """mmengine's ``Runner`` whose checkpoints are saved atomically and read safely.

    Select it with ``runner_type = 'mmplugin_inline.SafeCheckpointRunner'`` (the plugin's
    configs inherit it from ``configs/_base_/plugin_runtime.py``). mmdet's and mmseg's
    ``tools/train.py`` build a config's ``runner_type`` through mmengine's ``RUNNERS``,
    so their runs get the same guarantees as the plugin's ``tools/train.py``:

    * **Saving** (:meth:`save_checkpoint`): a checkpoint is written to ``NAME.part``,
      flushed to disk and renamed to ``NAME``, so a process killed while saving never
      leaves a truncated file under a checkpoint's name (local directories; other
      backends save as mmengine does).
    * **Loading** (:meth:`load_or_resume`: ``load_from``, ``resume``, a test's
      checkpoint): through :func:`~mmplugin_inline.weights.load_run_checkpoint`, i.e.
      ``weights_only=True`` with the allow-list of what mmengine saves, and a damaged
      file is a :class:`~mmplugin_inline.weights.DamagedCheckpointError` that says what
      is wrong with it. Model initialisation (pretrained backbone weights) is not in that
      scope. ``verify_hash = False`` at the config's top level turns off the check of a
      published ``NAME-<sha256>.pth`` name; full unpickling (only for files you trust) is
      :attr:`allow_unsafe`.
    * **Auto-resume** (``resume=True`` without ``load_from``, mmdet's ``--resume``):
      from the newest *sound* checkpoint of the work directory
      (:func:`latest_sound_checkpoint`), not whatever ``last_checkpoint`` names.
    * **Random state**: :class:`~mmplugin_inline.engine.RandomStateHook` is added to
      ``custom_hooks`` (once), so a resumed deterministic run draws the random numbers
      of the uninterrupted one.
    * **Files of release 0.1**: the backbones upgrade their keys on loading, and a
      resumed run gets the file's optimizer state in today's parameter order
      (:mod:`~mmplugin_inline.engine.legacy_resume`).
    """

    #: Read the checkpoint with full unpickling, which runs code from the file (only for
    #: files you trust). The plugin's tools set it on the built runner for
    #: ``--allow-unsafe``; with other tools, ``allow_unsafe = True`` at the config's top
    #: level (``--cfg-options allow_unsafe=True``) does the same.
    allow_unsafe: bool = False

    @classmethod
    def from_cfg(cls, cfg) -> 'SafeCheckpointRunner':
        """Build the runner from a config, after :func:`choose_auto_resume` and
        :func:`add_random_state_hook` on a copy of it."""
        cfg = copy.deepcopy(cfg)
        choose_auto_resume(cfg)
        add_random_state_hook(cfg)
        return super().from_cfg(cfg)

    def load_or_resume(self) -> None:
        """mmengine's ``load_or_resume``, reading the checkpoint with the plugin's policy
        (:func:`~mmplugin_inline.weights.mmengine_checkpoint_loading`)."""
        allow_unsafe = self.allow_unsafe or bool(self.cfg.get('allow_unsafe', False))
        with mmengine_checkpoint_loading(allow_unsafe=allow_unsafe,
                                         verify_hash=bool(self.cfg.get('verify_hash', True))):
            return super().load_or_resume()

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module.', '')]):  # noqa: B006 (mmengine's)
        """mmengine's ``load_checkpoint``; the optimizer state of a file of release 0.1 is
        reordered to today's parameters (:func:`upgrade_optimizer_state`)."""
        checkpoint = super().load_checkpoint(filename, map_location=map_location, strict=strict,
                                             revise_keys=revise_keys)
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get('state_dict'), dict) \
                and 'optimizer' in checkpoint:
            model = self.model.module if is_model_wrapper(self.model) else self.model
            upgraded = upgrade_optimizer_state(model, checkpoint['state_dict'],
                                               checkpoint['optimizer'])
            if upgraded is not None:
                checkpoint['optimizer'] = upgraded
        return checkpoint

    def save_checkpoint(self, out_dir: str, filename: str, file_client_args=None,
                        save_optimizer: bool = True, save_param_scheduler: bool = True,
                        meta: Optional[dict] = None, by_epoch: bool = True,
                        backend_args: Optional[dict] = None):
        """mmengine's ``save_checkpoint`` (same arguments), written to ``FILENAME.part``
        and renamed to ``FILENAME`` once complete when ``out_dir`` is a local directory."""
        local = not file_client_args and not backend_args and '://' not in str(out_dir)
        written = filename + '.part' if local else filename
        super().save_checkpoint(out_dir, written, file_client_args=file_client_args,
                                save_optimizer=save_optimizer,
                                save_param_scheduler=save_param_scheduler, meta=meta,
                                by_epoch=by_epoch, backend_args=backend_args)
        if local and is_main_process():  # mmengine's save writes on rank 0 only
            path = osp.join(out_dir, written)
            with open(path, 'rb+') as f:
                os.fsync(f.fileno())
            os.replace(path, osp.join(out_dir, filename))
