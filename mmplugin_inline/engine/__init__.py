"""The machinery around mmengine's Runner: training-loop hooks (``RandomStateHook``,
``TimeBudgetHook``), the runner set-up of ``tools/train.py`` / ``tools/test.py``
(:mod:`.runner_setup`: atomic saves, auto-resume, CPU DDP, ``build_checked_runner``) and
the check of a run's files before it starts (:mod:`.preflight`)."""
from .random_state import RandomStateHook
from .time_budget import TimeBudgetHook

__all__ = ['RandomStateHook', 'TimeBudgetHook']
