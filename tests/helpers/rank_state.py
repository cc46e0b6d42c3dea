"""A hook for distributed test runs: each process saves the state dict it ends with.

A test config imports this module (``custom_imports``, with ``tests/`` on PYTHONPATH)
and adds ``dict(type='SaveRankStateHook', out_dir=...)`` to ``custom_hooks``."""
import os
import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


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
