"""Hooks for test runs of tools/train.py. A test config imports this module
(``custom_imports``, with ``tests/`` on PYTHONPATH, see ``runs.dist_train_args``)."""
import os
import os.path as osp
import time

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

PAUSED = 'test run paused after iteration'


@HOOKS.register_module()
class SaveRankStateHook(Hook):
    """After training, write ``OUT_DIR/rank{RANK}.pth``: this process's model state dict."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def after_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        os.makedirs(self.out_dir, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        torch.save(state, osp.join(self.out_dir, f'rank{get_rank()}.pth'))


@HOOKS.register_module()
class PauseHook(Hook):
    """After iteration ``after_iter`` (and any checkpoint it saves), print ``PAUSED N
    (RUNNER CLASS)`` and sleep, so that a test can kill the run at a known point. Draws no
    random numbers."""
    priority = 'LOWEST'

    def __init__(self, after_iter: int, seconds: float = 900):
        self.after_iter, self.seconds = after_iter, seconds

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.after_iter:
            print(f'{PAUSED} {self.after_iter} ({type(runner).__name__})', flush=True)
            time.sleep(self.seconds)
