"""Train for a wall-clock budget with a learning-rate schedule over time."""
import math
import time

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

    Args:
        budget_s (float): seconds of training (validation time included).
        warmup_iters (int): linear warm-up length. Default: 100.
        warmup_ratio (float): learning-rate factor at the first iteration. Default: 0.001.
        min_lr_ratio (float): factor at the end of the budget. Default: 0.01.
    """
    priority = 'VERY_HIGH'

    def __init__(self, budget_s: float, warmup_iters: int = 100, warmup_ratio: float = 1e-3,
                 min_lr_ratio: float = 0.01):
        if budget_s <= 0:
            raise ValueError(f'budget_s must be positive, got {budget_s}')
        self.budget_s, self.warmup_iters = float(budget_s), warmup_iters
        self.warmup_ratio, self.min_lr_ratio = warmup_ratio, min_lr_ratio
        self._start = None
        self._base_lrs = None
        self._ceiling = None

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def lr_factor(self, it: int, elapsed: float) -> float:
        """Warm-up factor (by iteration) times the cosine factor (by time)."""
        warm = 1.0
        if it < self.warmup_iters:
            warm = self.warmup_ratio + (1 - self.warmup_ratio) * (it + 1) / self.warmup_iters
        frac = min(elapsed / self.budget_s, 1.0)
        cos = self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        return warm * cos

    def before_train(self, runner) -> None:
        self._start = time.monotonic()
        self._ceiling = runner.train_loop.max_iters
        optimizer = runner.optim_wrapper.optimizer
        self._base_lrs = [g.get('initial_lr', g['lr']) for g in optimizer.param_groups]

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        factor = self.lr_factor(runner.iter, self.elapsed())
        for group, base in zip(runner.optim_wrapper.optimizer.param_groups, self._base_lrs):
            group['lr'] = base * factor

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        loop = runner.train_loop
        done = runner.iter + 1                      # iterations finished so far
        elapsed = self.elapsed()
        if elapsed >= self.budget_s:
            loop._max_iters = done                  # validate, save and stop after this one
            return
        rate = elapsed / done                       # seconds per iteration so far
        estimate = done + int((self.budget_s - elapsed) / max(rate, 1e-6))
        loop._max_iters = max(done + 1, min(self._ceiling, estimate))
