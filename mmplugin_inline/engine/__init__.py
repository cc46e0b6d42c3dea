"""The machinery around mmengine's Runner: the plugin's runner
(:class:`SafeCheckpointRunner`, :mod:`.runner`: atomic saves, the run's checkpoints read
safely, auto-resume from a sound checkpoint), training-loop hooks (``RandomStateHook``,
``TimeBudgetHook``), the set-up that ``tools/train.py`` / ``tools/test.py`` add
(:mod:`.runner_setup`: CPU DDP, ``build_checked_runner``) and the check of a run's files
before it starts (:mod:`.preflight`)."""
from .random_state import RandomStateHook
from .runner import SafeCheckpointRunner
from .time_budget import TimeBudgetHook

__all__ = ['RandomStateHook', 'SafeCheckpointRunner', 'TimeBudgetHook']
