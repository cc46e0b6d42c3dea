"""Training-loop helpers (mmengine hooks)."""
from .random_state import RandomStateHook
from .time_budget import TimeBudgetHook

__all__ = ['RandomStateHook', 'TimeBudgetHook']
