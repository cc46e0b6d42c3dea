"""Train for a wall-clock budget with a learning-rate schedule over time."""
import math
import time

import torch
from mmengine.dist import broadcast, get_world_size
from mmengine.hooks import Hook

from mmplugin_inline.registry import HOOKS


@HOOKS.register_module()
class TimeBudgetHook(Hook):
    """End an iteration-based run when ``budget_s`` seconds of training have passed.

    The learning rate follows a linear warm-up over ``warmup_iters`` iterations, then a
    cosine decay over *time* that reaches ``min_lr_ratio`` of the base rate exactly
    when the budget ends, however the seconds per iteration change during the run
    (they grow once the RPN starts proposing objects, so a schedule sized from the
    first iterations would overshoot). The loop's ``max_iters`` is kept at an estimate
    of the iterations that fit, so the logged ETA is the remaining budget; the run
    then validates and saves as at a normal end. Use it instead of ``param_scheduler``.

    Checkpoints carry the hook's state under ``checkpoint['time_budget']`` (plain
    numbers and lists): the seconds of budget used, the base learning rates and the
    iteration ceiling. ``--resume`` continues the clock and the schedule from there with
    the original base rates (the optimizer's own state only holds the last *scaled*
    rates); ``budget_s``, ``max_iters`` and the warm-up come from the config, so a longer
    budget there extends a finished run. ``load_from`` (weights only) starts afresh.

    Under DDP every process reads rank 0's clock (broadcast twice an iteration), so all
    of them set the same learning rate and stop after the same iteration.

    Args:
        budget_s (float): seconds of training (validation time included).
        warmup_iters (int): linear warm-up length. Default: 100.
        warmup_ratio (float): learning-rate factor at the first iteration. Default: 0.001.
        min_lr_ratio (float): factor at the end of the budget. Default: 0.01.
        min_iters (int): iterations trained even when the budget ends sooner (a slow or
            busy machine still gets through them); the config's ``max_iters`` stays the
            ceiling of both. Default: 1.
    """
    priority = 'VERY_HIGH'
    STATE_KEY = 'time_budget'  # the hook's entry in a checkpoint

    def __init__(self, budget_s: float, warmup_iters: int = 100, warmup_ratio: float = 1e-3,
                 min_lr_ratio: float = 0.01, min_iters: int = 1):
        if budget_s <= 0:
            raise ValueError(f'budget_s must be positive, got {budget_s}')
        if int(min_iters) != min_iters or min_iters < 1:
            raise ValueError(f'min_iters must be a whole number of at least 1, got {min_iters}')
        self.min_iters = int(min_iters)
        self.budget_s, self.warmup_iters = float(budget_s), warmup_iters
        self.warmup_ratio, self.min_lr_ratio = warmup_ratio, min_lr_ratio
        self._start = None
        self._base_lrs = None
        self._ceiling = None
        self._loaded = None  # (state, iterations done) from the checkpoint being loaded

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def shared_elapsed(self) -> float:
        """:meth:`elapsed` of rank 0, on every process (a broadcast under DDP)."""
        elapsed = self.elapsed()
        if get_world_size() > 1:
            value = torch.tensor([elapsed], dtype=torch.float64)
            broadcast(value, src=0)
            elapsed = float(value.item())
        return elapsed

    def lr_factor(self, it: int, elapsed: float) -> float:
        """Warm-up factor (by iteration) times the cosine factor (by time)."""
        warm = 1.0
        if it < self.warmup_iters:
            warm = self.warmup_ratio + (1 - self.warmup_ratio) * (it + 1) / self.warmup_iters
        frac = min(elapsed / self.budget_s, 1.0)
        cos = self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        return warm * cos

    def before_train(self, runner) -> None:
        """Start the clock, or continue it on resume; take the base learning rates."""
        self._ceiling = runner.train_loop.max_iters  # the config's, also on resume
        groups = runner.optim_wrapper.optimizer.param_groups
        loaded, self._loaded = self._loaded, None
        # resume sets the loop's iteration from the checkpoint; load_from leaves it at 0
        if loaded is not None and runner.iter > 0 and runner.iter == loaded[1]:
            if self._restore(runner, loaded[0], len(groups)):
                return
        elif runner.iter > 0:
            runner.logger.warning(
                f'TimeBudgetHook: resumed at iteration {runner.iter} from a checkpoint without '
                f'the hook\'s state; the budget of {self.budget_s:g} s starts again and the base '
                'learning rates are read from the optimizer (the last scheduled ones).')
        self._start = time.monotonic()
        self._base_lrs = [g.get('initial_lr', g['lr']) for g in groups]

    def _restore(self, runner, state: dict, num_groups: int) -> bool:
        """Continue the clock and the base rates of ``state``; False if it does not fit."""
        if len(state['base_lrs']) != num_groups:
            runner.logger.warning(
                f'TimeBudgetHook: the checkpoint has {len(state["base_lrs"])} base learning '
                f'rates for {num_groups} parameter groups; the budget starts again.')
            return False
        self._start = time.monotonic() - state['elapsed_s']
        self._base_lrs = list(state['base_lrs'])
        changed = [f'{key} {state[key]:g} -> {now:g}' for key, now in
                   (('budget_s', self.budget_s), ('max_iters', self._ceiling)) if state[key] != now]
        runner.logger.info(
            f'TimeBudgetHook: resumed with {state["elapsed_s"]:.1f} s of the budget used'
            + (f' ({", ".join(changed)} by the config)' if changed else ''))
        return True

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Store the clock, the base rates and the ceiling as plain numbers."""
        if self._start is None:  # not training yet
            return
        checkpoint[self.STATE_KEY] = dict(
            elapsed_s=float(self.elapsed()), base_lrs=[float(lr) for lr in self._base_lrs],
            budget_s=float(self.budget_s), max_iters=int(self._ceiling))

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keep the stored state; ``before_train`` uses it if this load is a resume."""
        state = checkpoint.get(self.STATE_KEY)
        done = checkpoint.get('meta', {}).get('iter')
        self._loaded = None if state is None or done is None else (state, done)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        factor = self.lr_factor(runner.iter, self.shared_elapsed())
        for group, base in zip(runner.optim_wrapper.optimizer.param_groups, self._base_lrs):
            group['lr'] = base * factor

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        loop = runner.train_loop
        done = runner.iter + 1                      # iterations finished so far
        elapsed = self.shared_elapsed()
        floor = min(self.min_iters, self._ceiling)
        if done >= self._ceiling or (elapsed >= self.budget_s and done >= floor):
            loop._max_iters = done                  # validate, save and stop after this one
            return
        rate = elapsed / done                       # seconds per iteration so far
        estimate = done + int(max(self.budget_s - elapsed, 0.0) / max(rate, 1e-6))
        loop._max_iters = min(self._ceiling, max(done + 1, floor, estimate))
