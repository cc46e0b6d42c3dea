"""TimeBudgetHook: a real mmengine run ends on time, validates, follows the schedule and
resumes where it stopped."""
import math
import time

import pytest
import torch
import torch.nn as nn
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DefaultScope
from mmengine.runner import Runner

import mmplugin_inline  # noqa: F401
from mmplugin_inline.engine import TimeBudgetHook
from mmplugin_inline.weights import load_run_checkpoint, mmengine_checkpoint_loading


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


def _stand_in_runner(max_iters, group):
    """What TimeBudgetHook reads of a runner: the iteration, the train loop's
    ``max_iters`` / ``_max_iters``, a logger and one optimizer parameter group."""
    from types import SimpleNamespace
    from unittest import mock
    loop = SimpleNamespace(max_iters=max_iters, _max_iters=max_iters)
    return SimpleNamespace(iter=0, train_loop=loop, logger=mock.Mock(),
                           optim_wrapper=SimpleNamespace(
                               optimizer=SimpleNamespace(param_groups=[group])))


def _loop_with(hook, max_iters, clock):
    """Iterations a stand-in of mmengine's IterBasedTrainLoop runs under ``hook``, with
    ``clock`` the seconds the hook reads (advanced 1 s an iteration)."""
    from unittest import mock
    runner = _stand_in_runner(max_iters, dict(lr=0.1))
    loop = runner.train_loop
    with mock.patch.object(time, 'monotonic', lambda: clock[0]):
        hook.before_train(runner)
        while runner.iter < loop._max_iters:
            hook.before_train_iter(runner, runner.iter)
            clock[0] += 1.0
            hook.after_train_iter(runner, runner.iter)
            runner.iter += 1
    return runner.iter


def test_the_configs_max_iters_stays_the_ceiling():
    # a budget far from used up: the run still ends at the config's max_iters, not beyond
    assert _loop_with(TimeBudgetHook(budget_s=1000, warmup_iters=0), 3, [0.0]) == 3
    assert _loop_with(TimeBudgetHook(budget_s=1000, warmup_iters=0, min_iters=10), 3,
                      [0.0]) == 3


def test_min_iters_are_trained_when_the_budget_ends_sooner():
    # 1 s an iteration against a 2.5 s budget: 3 iterations alone, 7 with min_iters=7
    assert _loop_with(TimeBudgetHook(budget_s=2.5, warmup_iters=0), 100, [0.0]) == 3
    assert _loop_with(TimeBudgetHook(budget_s=2.5, warmup_iters=0, min_iters=7), 100,
                      [0.0]) == 7
    # and past them the budget rules again: a longer budget, not min_iters, sets the end
    assert _loop_with(TimeBudgetHook(budget_s=9.5, warmup_iters=0, min_iters=2), 100,
                      [0.0]) == 10
    for bad in (0, 2.5, -1):
        with pytest.raises(ValueError, match='min_iters'):
            TimeBudgetHook(budget_s=1, min_iters=bad)


# --------------------------------------------------------------------------- resume

class _LrRecord(Hook):
    """The learning rate the budget hook set at each iteration, and when it started."""
    priority = 'LOW'  # after TimeBudgetHook (VERY_HIGH) has set the rate

    def __init__(self):
        self.iters = []  # (iteration, lr, time.monotonic() at its start)
        self.last_end = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        lr = runner.optim_wrapper.optimizer.param_groups[0]['lr']
        self.iters.append((runner.iter, lr, time.monotonic()))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.last_end = time.monotonic()


def _budget_runner(work_dir, record, budget_s, warmup_iters, **kwargs):
    return Runner(
        model=_Slow(), work_dir=str(work_dir), train_dataloader=_loader(),
        train_cfg=dict(by_epoch=False, max_iters=10_000),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        custom_hooks=[dict(type='mmplugin_inline.TimeBudgetHook', budget_s=budget_s,
                           warmup_iters=warmup_iters), record],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=5, by_epoch=False)),
        default_scope='mmengine', **kwargs)


def _budget_hook(runner):
    return next(h for h in runner.hooks if isinstance(h, TimeBudgetHook))


def test_resume_continues_the_clock_and_the_schedule(tmp_path):
    with DefaultScope.overwrite_default_scope('mmengine'):
        _resume_mid_budget(tmp_path)


def _resume_mid_budget(tmp_path, budget_s=2.0, warmup_iters=30):
    # a full run, checkpoints every 5 iterations (~0.05 s each, all within the warm-up)
    first = _budget_runner(tmp_path / 'first', _LrRecord(), budget_s, warmup_iters)
    first.train()
    states = {}
    for path in (tmp_path / 'first').glob('iter_*.pth'):
        checkpoint = load_run_checkpoint(str(path))
        states[str(path)] = (checkpoint['meta']['iter'], checkpoint[TimeBudgetHook.STATE_KEY])
    # the checkpoint nearest the middle of the budget, as if the run had died there
    path, (done, state) = min(states.items(),
                              key=lambda kv: abs(kv[1][1]['elapsed_s'] - budget_s / 2))
    used = state['elapsed_s']
    assert 0.2 * budget_s < used < 0.8 * budget_s and done < warmup_iters
    assert state == dict(elapsed_s=used, base_lrs=[0.1], budget_s=budget_s, max_iters=10_000)
    assert type(used) is float and type(state['base_lrs'][0]) is float  # weights_only-safe
    assert type(state['max_iters']) is int

    record = _LrRecord()
    resumed = _budget_runner(tmp_path / 'resumed', record, budget_s, warmup_iters,
                             resume=True, load_from=path)
    start = time.monotonic()
    with mmengine_checkpoint_loading():
        resumed.train()
    hook = _budget_hook(resumed)
    assert hook._base_lrs == [0.1]  # the config's rate, not the last scheduled one

    # the first resumed iteration continues the schedule: the hook's clock read `used`
    # plus at most the time from train() to that iteration
    it, lr, began = record.iters[0]
    assert it == done
    latest = 0.1 * hook.lr_factor(done, used + (began - start))
    earliest = 0.1 * hook.lr_factor(done, used)
    assert latest * (1 - 1e-9) <= lr <= earliest * (1 + 1e-9)
    assert lr > 0.3 * earliest  # neither the warm-up start nor the rate scaled twice

    # it stops when the budget is spent in all, not after a new full budget
    assert resumed.iter > done and resumed.train_loop.max_iters == resumed.iter
    assert used + (record.last_end - start) >= budget_s
    assert used + (record.last_end - began) < budget_s + 0.5


def test_load_from_starts_the_budget_afresh_and_resume_continues_it():
    from types import SimpleNamespace

    from mmengine.logging import MMLogger
    hook = TimeBudgetHook(budget_s=10)
    checkpoint = {'meta': dict(iter=20), TimeBudgetHook.STATE_KEY: dict(
        elapsed_s=4.0, base_lrs=[0.1], budget_s=10.0, max_iters=100)}
    runner = SimpleNamespace(
        iter=0, train_loop=SimpleNamespace(max_iters=100),
        optim_wrapper=SimpleNamespace(optimizer=SimpleNamespace(param_groups=[dict(lr=0.02)])),
        logger=MMLogger.get_instance('test_time_budget'))
    hook.before_save_checkpoint(runner, {})  # before training: nothing to store, no error

    hook.after_load_checkpoint(runner, checkpoint)  # load_from: the loop stays at iteration 0
    hook.before_train(runner)
    assert hook.elapsed() < 1 and hook._base_lrs == [0.02]

    runner.iter = 20  # resume: the loop continues at the checkpoint's iteration
    hook.after_load_checkpoint(runner, checkpoint)
    hook.before_train(runner)
    assert hook.elapsed() == pytest.approx(4.0, abs=0.5) and hook._base_lrs == [0.1]
    saved = {}
    hook.before_save_checkpoint(runner, saved)
    assert saved[TimeBudgetHook.STATE_KEY]['base_lrs'] == [0.1]
    assert 4.0 <= saved[TimeBudgetHook.STATE_KEY]['elapsed_s'] < 4.5

    hook.before_train(runner)  # resumed from a file without the state: starts again
    assert hook.elapsed() < 1 and hook._base_lrs == [0.02]


# --------------------------------------------------------------------------- time budget, DDP

def _budget_rank(rank, rendezvous, skew_s, results):
    """One of two gloo processes running TimeBudgetHook on a stand-in runner; once
    training has started, rank 1's clock jumps ``skew_s`` ahead (its own reading of the
    budget is used up: a process that started its clock earlier, or was held up)."""
    from unittest import mock

    import torch
    import torch.distributed as dist

    from mmplugin_inline.engine import TimeBudgetHook
    dist.init_process_group('gloo', init_method=f'file://{rendezvous}', rank=rank,
                            world_size=2)
    try:
        offset = [0.0]
        with mock.patch.object(time, 'monotonic', lambda: time.perf_counter() + offset[0]):
            group = dict(params=[torch.zeros(1)], lr=0.1)
            runner = _stand_in_runner(100, group)
            loop = runner.train_loop
            hook = TimeBudgetHook(budget_s=30.0, warmup_iters=0)
            hook.before_train(runner)
            offset[0] = skew_s if rank == 1 else 0.0
            seen = []
            for it in range(3):
                runner.iter = it
                hook.before_train_iter(runner, it)
                hook.after_train_iter(runner, it)
                seen.append((group['lr'], loop._max_iters))
        results[rank] = seen
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_time_budget_follows_rank_0_clock_under_ddp(tmp_path):
    import torch.multiprocessing as mp
    with mp.Manager() as manager:
        results = manager.dict()
        # a file rendezvous: no port to find free and hand over
        mp.spawn(_budget_rank, args=(str(tmp_path / 'rendezvous'), 1000.0, results), nprocs=2)
        rank0, rank1 = results[0], results[1]
    # rank 1's own clock is past the 30 s budget: alone it would stop after one iteration
    assert rank0[0][1] > 1
    assert rank1 == rank0  # the same learning rates and iteration ceilings on both
