"""Training-loop helpers (mmengine hooks)."""
from .time_budget import TimeBudgetHook

__all__ = ['TimeBudgetHook']
