"""Carry the random number generators through checkpoints, so a resumed run draws the
same random numbers as the uninterrupted one."""
import random
from typing import List, Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_dist_info
from mmengine.hooks import CheckpointHook, Hook
from mmengine.runner import IterBasedTrainLoop

from mmplugin_inline.registry import HOOKS


def capture_random_state() -> dict:
    """The states of Python's, numpy's and torch's global generators, as plain data
    (tuples, ints, int64 tensors: readable with ``torch.load(weights_only=True)``)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = dict(python=random.getstate(),
                 numpy=dict(name=name, keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos),
                            has_gauss=int(has_gauss), gauss=float(gauss)),
                 torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def restore_random_state(state: dict) -> None:
    """Set the global generators to a :func:`capture_random_state` result."""
    random.setstate(state['python'])
    n = state['numpy']
    np.random.set_state((n['name'], n['keys'].numpy().astype(np.uint32), n['pos'],
                         n['has_gauss'], n['gauss']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


class _RestoreAfterSkip:
    """Stands in for an ``IterBasedTrainLoop``'s data iterator while the loop skips the
    batches a resumed run has already trained on; sets the generators to ``state`` once
    the skip is over, then hands the loop its own iterator back.

    Both ways of skipping are followed: the official mmengine draws the skipped batches
    one by one (``next``, the pipeline runs and draws random numbers); the maintained fork
    calls the iterator's ``skip_iter(n)``, which advances the sampler without loading
    them. Anything else is the real iterator's.
    """

    def __init__(self, loop, skip: int, state: dict):
        self.loop, self.skip, self.state = loop, skip, state
        self.iterator = loop.dataloader_iterator

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.iterator)
        self.skip -= 1
        if self.skip <= 0:
            self._done()
        return batch

    def skip_iter(self, num_iters: int) -> None:
        """The fork's skip: the real iterator's, then the state is restored."""
        self.iterator.skip_iter(num_iters)
        self._done()

    def __getattr__(self, name):
        if name == 'iterator':  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.iterator, name)

    def _done(self) -> None:
        restore_random_state(self.state)
        self.loop.dataloader_iterator = self.iterator


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Save the random generators' states in each checkpoint and restore them on resume.

    mmengine seeds the generators once, at start-up; a resumed run starts again from that
    seed, so it draws other random numbers than the uninterrupted run (augmentations,
    RoI sampling, drop path). With this hook a deterministic run that is stopped (even
    killed) and resumed ends with the weights of the run that was not.

    - Checkpoints get ``checkpoint['random_state']``: one state per process (gathered to
      rank 0 when a checkpoint is due under DDP), as plain data.
    - On resume (not on ``load_from``) each process restores its own state where the
      uninterrupted run was: at the start of the next epoch, or, in an
      ``IterBasedTrainLoop``, after the loop has skipped the batches already trained
      (mmengine runs them through the pipeline, which draws random numbers).
    - Validation runs with the generators set aside and put back afterwards, so it does
      not change the training's random numbers (creating a data loader iterator draws
      one), whether or not it falls right after a checkpoint.

    A checkpoint from another number of processes, or without the state, resumes with
    a warning and mmengine's seeding.
    """
    priority = 'LOW'  # after_train_iter / _epoch before CheckpointHook (VERY_LOW)
    STATE_KEY = 'random_state'

    def __init__(self):
        self._states: Optional[List[dict]] = None  # every rank's, for the next checkpoint
        self._loaded = None  # (states, iterations done) of the checkpoint being loaded
        self._resume_state = None  # this rank's state, to restore when training starts
        self._val_state = None

    # ------------------------------------------------------------------ saving

    @staticmethod
    def _checkpoint_due(runner, by_epoch: bool) -> bool:
        """Whether a ``CheckpointHook`` saves after this iteration (epoch)."""
        for hook in runner.hooks:
            if not isinstance(hook, CheckpointHook) or hook.by_epoch != by_epoch:
                continue
            if by_epoch and (hook.every_n_epochs(runner, hook.interval, hook.save_begin)
                             or (hook.save_last and hook.is_last_train_epoch(runner))):
                return True
            if not by_epoch and (hook.every_n_train_iters(runner, hook.interval,
                                                          hook.save_begin)
                                 or (hook.save_last and hook.is_last_train_iter(runner))):
                return True
        return False

    def _gather_if_due(self, runner, by_epoch: bool) -> None:
        self._states = None
        if get_dist_info()[1] > 1 and self._checkpoint_due(runner, by_epoch):
            self._states = all_gather_object(capture_random_state())  # every rank joins

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._gather_if_due(runner, by_epoch=False)

    def after_train_epoch(self, runner) -> None:
        self._gather_if_due(runner, by_epoch=True)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """(rank 0) Store every rank's state; one process: its own."""
        world = get_dist_info()[1]
        states = self._states if world > 1 else [capture_random_state()]
        if states is not None and len(states) == world:
            checkpoint[self.STATE_KEY] = states
        self._states = None

    # ------------------------------------------------------------------ resuming

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        states = checkpoint.get(self.STATE_KEY)
        done = checkpoint.get('meta', {}).get('iter')
        self._loaded = None if states is None or done is None else (states, done)

    def before_train(self, runner) -> None:
        """Take this rank's state if the checkpoint just loaded is being resumed."""
        loaded, self._loaded = self._loaded, None
        self._resume_state = None
        if runner.iter == 0:  # a fresh run, or load_from (weights only)
            return
        rank, world = get_dist_info()
        if loaded is None or loaded[1] != runner.iter:
            runner.logger.warning(
                f'RandomStateHook: the checkpoint resumed at iteration {runner.iter} holds no '
                'random state; the resumed run draws other random numbers than an '
                'uninterrupted one would.')
        elif len(loaded[0]) != world:
            runner.logger.warning(
                f'RandomStateHook: the checkpoint holds the random states of '
                f'{len(loaded[0])} processes, this run has {world}; they are not restored.')
        else:
            self._resume_state = loaded[0][rank]

    def before_train_epoch(self, runner) -> None:
        """Restore the resumed state: now (epochs), or after the loop's skip (iterations)."""
        state, self._resume_state = self._resume_state, None
        if state is None:
            return
        loop = runner.train_loop
        # the fork's loop may be told not to skip the trained batches at all
        skips = not getattr(loop, 'fast_forward_on_resume', False)
        if isinstance(loop, IterBasedTrainLoop) and loop.iter > 0 and skips:
            loop.dataloader_iterator = _RestoreAfterSkip(loop, loop.iter, state)
            runner.logger.info('RandomStateHook: the random state of the checkpoint is '
                               f'restored once the loop has skipped {loop.iter} batches')
        else:
            restore_random_state(state)
            runner.logger.info('RandomStateHook: random state restored from the checkpoint')

    # ------------------------------------------------------------------ validation

    def before_val(self, runner) -> None:
        self._val_state = capture_random_state()

    def after_val(self, runner) -> None:
        if self._val_state is not None:
            restore_random_state(self._val_state)
            self._val_state = None
