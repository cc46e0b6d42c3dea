"""TimeBudgetHook: a real mmengine run ends on time, validates, and follows the schedule."""
import math
import time

import pytest
import torch
import torch.nn as nn
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.registry import DefaultScope
from mmengine.runner import Runner

import mmplugin_inline  # noqa: F401
from mmplugin_inline.engine import TimeBudgetHook


class _Slow(BaseModel):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        time.sleep(0.05)
        out = self.fc(inputs)                   # default_collate stacked them: [B, 2]
        if mode == 'loss':
            return dict(loss=out.square().mean())
        return [dict(pred=o) for o in out]


class _Count(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results.append(len(data_samples))

    def compute_metrics(self, results):
        return dict(seen=sum(results))


def _loader():
    return dict(dataset=[dict(inputs=torch.ones(2)) for _ in range(8)], batch_size=2,
                sampler=dict(type='InfiniteSampler', shuffle=False),
                collate_fn=dict(type='default_collate'))


def test_run_stops_at_the_budget_then_validates(tmp_path):
    # the Runner makes 'mmengine' the current default scope; restore it afterwards
    with DefaultScope.overwrite_default_scope('mmengine'):
        _run_with_budget(tmp_path)


def _run_with_budget(tmp_path):
    val_loader = dict(_loader(), sampler=dict(type='DefaultSampler', shuffle=False))
    runner = Runner(
        model=_Slow(), work_dir=str(tmp_path), train_dataloader=_loader(),
        val_dataloader=val_loader, val_evaluator=[_Count()], val_cfg=dict(),
        train_cfg=dict(by_epoch=False, max_iters=10_000, val_interval=10_000),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        custom_hooks=[dict(type='mmplugin_inline.TimeBudgetHook', budget_s=1.0, warmup_iters=2)],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=10_000,
                                           by_epoch=False)),
        default_scope='mmengine')
    start = time.monotonic()
    runner.train()
    took = time.monotonic() - start
    assert 5 <= runner.iter < 60            # ~0.05 s an iteration for 1 s, not 10 000
    assert took < 10
    assert runner.train_loop.max_iters == runner.iter
    lr = runner.optim_wrapper.optimizer.param_groups[0]['lr']
    assert lr < 0.1 * 0.1                   # the cosine has come down by the end
    assert (tmp_path / f'iter_{runner.iter}.pth').exists()  # saved as at a normal end
    assert runner.message_hub.get_scalar('val/seen').current() == 8  # and validated


def test_lr_factor_warms_up_by_iteration_and_decays_by_time():
    hook = TimeBudgetHook(budget_s=100, warmup_iters=10, warmup_ratio=0.0, min_lr_ratio=0.0)
    assert hook.lr_factor(0, 0.0) == pytest.approx(0.1)
    assert hook.lr_factor(9, 0.0) == pytest.approx(1.0)
    assert hook.lr_factor(50, 50.0) == pytest.approx(0.5)
    assert hook.lr_factor(50, 25.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert hook.lr_factor(99, 150.0) == pytest.approx(0.0)


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match='budget_s'):
        TimeBudgetHook(budget_s=0)
