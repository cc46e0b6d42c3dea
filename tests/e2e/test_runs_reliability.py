"""Long runs: two runs with one seed train alike, a run killed with SIGKILL and resumed
ends with the weights of one that was not, a save cut short is never resumed from, and
two processes hold the same weights. Real ``tools/train.py`` runs on CPU."""
import os
import os.path as osp
import shutil
import time

import pytest

from helpers.run_hooks import PAUSED
from helpers.runs import (PYTHON, kill_when_logged, max_weight_difference, ok, run_tool,
                          train_losses)
from helpers.tiny_models import REPO
from helpers.tool_configs import resumable_mask_rcnn

ITERS, INTERVAL = 20, 3
TIMEOUT = 900  # s per tool run: generous for a loaded 2-core machine
SEED = ['--cfg-options', 'randomness.seed=7', 'randomness.deterministic=True']


def _train(config, work, *extra):
    return [PYTHON, osp.join(REPO, 'tools/train.py'), str(config), '--work-dir', str(work),
            *extra]


def _run_train(config, work, *extra):
    """``tools/train.py CONFIG --work-dir WORK EXTRA...``: (returncode, output, stderr)."""
    return run_tool(_train(config, work, *extra), timeout=TIMEOUT, env=HOOKS_ENV)


HOOKS_ENV = dict(PYTHONPATH=REPO + os.pathsep + osp.join(REPO, 'tests'))  # helpers.run_hooks


def _with_hooks(config, name, *hooks):
    """A copy of ``config`` named ``name`` beside it, with the test hooks ``hooks``
    (``helpers.run_hooks``) in ``custom_hooks``."""
    path = osp.join(osp.dirname(str(config)), name)
    with open(config) as f:
        text = f.read()
    with open(path, 'w') as f:
        f.write(text + "custom_imports = dict(imports=['mmplugin_inline', 'helpers.run_hooks'], "
                "allow_failed_imports=False)\n"
                f"custom_hooks = {list(hooks)!r}\n")
    return path


@pytest.fixture(scope='module')
def reference(shapes, tmp_path_factory):
    """An uninterrupted run: 20 iterations, checkpoints every 3 and at the end."""
    root = tmp_path_factory.mktemp('reliability')
    config = resumable_mask_rcnn(root, shapes + '/', ITERS, INTERVAL)
    work = root / 'reference'
    rc, out, _ = _run_train(config, work, *SEED)
    ok(rc, out)
    return config, work


@pytest.mark.slow
def test_two_runs_with_one_seed_log_the_same_losses(reference, tmp_path):
    config, ref = reference
    rc, out, _ = _run_train(config, tmp_path / 'again', *SEED)
    ok(rc, out)
    first, second = train_losses(ref), train_losses(tmp_path / 'again')
    assert sorted(first) == list(range(1, ITERS + 1))
    assert len(set(first.values())) > 1  # the losses move: the run really trained
    assert second == first  # exactly, iteration by iteration
    assert max_weight_difference(ref / f'iter_{ITERS}.pth',
                                 tmp_path / 'again' / f'iter_{ITERS}.pth') == 0


@pytest.mark.slow
def test_a_run_killed_mid_interval_resumes_to_the_same_weights(reference, tmp_path):
    config, ref = reference
    work = tmp_path / 'killed'
    # killed after iteration 4: past the checkpoint at 3, before the one at 6 (the run
    # waits there for the kill; the hook draws no random numbers)
    pausing = _with_hooks(config, 'pausing.py', dict(type='PauseHook', after_iter=4))
    rc, out = kill_when_logged(_train(pausing, work, *SEED), f'{PAUSED} 4', timeout=TIMEOUT,
                               env=HOOKS_ENV)
    assert rc == -9, out[-3000:]
    with open(work / 'last_checkpoint') as f:
        assert f.read().strip() == str(work / 'iter_3.pth')
    assert max(train_losses(work)) == 4  # iteration 4 was trained, and lost with the process

    rc, out, _ = _run_train(config, work, '--resume', *SEED)
    ok(rc, out)
    assert 'resumed epoch: 0, iter: 3' in out
    assert not [n for n in os.listdir(work) if n.endswith('.part')]
    assert max_weight_difference(ref / f'iter_{ITERS}.pth', work / f'iter_{ITERS}.pth') == 0
    # the iterations trained again after the resume log what the reference logged
    assert train_losses(work) == train_losses(ref)


# --------------------------------------------------------------------------- saves cut short

def _truncate(path, keep=0.5):
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:int(len(data) * keep)])


def _work_dir_of_a_cut_save(work, pointer, ref=None):
    """A work directory as a run killed while saving iter_9.pth leaves it: iter_3 and
    iter_6 complete, iter_9.pth truncated (and the newest file), ``last_checkpoint``
    naming ``pointer``. The checkpoints are ``ref``'s, or small torch.save files."""
    import torch
    os.makedirs(work)
    for it in (3, 6, 9):
        if ref is None:
            torch.save({'meta': {'iter': it}, 'state_dict': {'w': torch.full((64,), it)}},
                       work / f'iter_{it}.pth')
        else:
            shutil.copy(ref / f'iter_{it}.pth', work / f'iter_{it}.pth')
        os.utime(work / f'iter_{it}.pth', (time.time() + it, time.time() + it))
    _truncate(work / 'iter_9.pth')
    (work / 'last_checkpoint').write_text(str(work / pointer))


@pytest.mark.parametrize('pointer, expected', [
    ('iter_6.pth', 'iter_6.pth'),  # mmengine's order: the .pth first, then last_checkpoint
    ('iter_9.pth', 'iter_6.pth'),  # the pointer names the cut file: the newest sound one
    ('iter_1.pth', 'iter_6.pth'),  # it names a file deleted before the save (max_keep_ckpts)
])
def test_auto_resume_never_picks_a_damaged_or_missing_checkpoint(tmp_path, pointer, expected):
    from mmplugin_inline.engine.runner_setup import latest_sound_checkpoint
    work = tmp_path / 'work'
    _work_dir_of_a_cut_save(work, pointer)
    path, skipped = latest_sound_checkpoint(str(work))
    assert path == str(work / expected)
    skipped = dict(skipped)
    if pointer == 'iter_9.pth':
        assert 'truncated' in skipped[str(work / 'iter_9.pth')]
    if pointer == 'iter_1.pth':
        assert 'does not exist' in skipped[str(work / 'iter_1.pth')]


def test_nothing_sound_to_resume_from_starts_afresh(tmp_path):
    from mmengine.config import Config

    from mmplugin_inline.engine.runner_setup import choose_auto_resume
    (tmp_path / 'iter_3.pth').write_bytes(b'')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_3.pth'))
    cfg = Config(dict(resume=True, load_from=None, work_dir=str(tmp_path)))
    choose_auto_resume(cfg)
    assert cfg.resume is False and cfg.load_from is None


def test_a_save_cut_short_leaves_no_file_under_the_checkpoint_name(tmp_path):
    from mmplugin_inline.engine.runner_setup import atomic_checkpoint_saves

    class Runner:
        def save_checkpoint(self, out_dir, filename, *args, **kwargs):
            with open(osp.join(out_dir, filename), 'wb') as f:
                f.write(b'PK\x03\x04 half a checkpoint')
                if filename.startswith('iter_2'):
                    raise KeyboardInterrupt  # the process dies while writing

    runner = atomic_checkpoint_saves(Runner())
    runner.save_checkpoint(str(tmp_path), 'iter_1.pth')
    assert sorted(os.listdir(tmp_path)) == ['iter_1.pth']
    with pytest.raises(KeyboardInterrupt):
        runner.save_checkpoint(str(tmp_path), 'iter_2.pth')
    assert sorted(os.listdir(tmp_path)) == ['iter_1.pth', 'iter_2.pth.part']


@pytest.mark.slow
def test_resume_of_a_cut_save_and_an_explicit_damaged_file(reference, tmp_path):
    config, ref = reference
    work = tmp_path / 'work'
    _work_dir_of_a_cut_save(work, 'iter_9.pth', ref)
    # --resume CHECKPOINT names the cut file: one clear message, no traceback
    rc, out, err = _run_train(config, work, '--resume', str(work / 'iter_9.pth'), *SEED)
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert 'iter_9.pth is truncated or corrupt' in err
    # --resume alone: the newest complete checkpoint, then one more iteration
    rc, out, _ = _run_train(config, work, '--resume', *SEED, 'train_cfg.max_iters=7')
    ok(rc, out)
    assert 'skipping' in out and 'resumed epoch: 0, iter: 6' in out
    assert osp.isfile(work / 'iter_7.pth')


# --------------------------------------------------------------------------- two processes

DDP_ITERS, DDP_INTERVAL = 6, 2


def _ddp_config(root, shapes, dump_dir, name, *hooks):
    """The resumable Mask R-CNN for 2 processes (4 images, 1 per process and step: 2 steps
    an epoch); every process saves the state dict it ends with into ``dump_dir``."""
    path = resumable_mask_rcnn(root, shapes + '/', DDP_ITERS, DDP_INTERVAL)
    return _with_hooks(path, name, dict(type='SaveRankStateHook', out_dir=str(dump_dir)),
                       *hooks)


def _ranks_agree(dump_dir, checkpoint):
    """Both processes end with the same weights, which rank 0 saved in ``checkpoint``."""
    import torch
    ranks = [torch.load(osp.join(dump_dir, f'rank{r}.pth'), weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
    from mmplugin_inline.weights import load_run_checkpoint
    saved = load_run_checkpoint(str(checkpoint), map_location='cpu')['state_dict']
    assert all(torch.equal(saved[k], ranks[0][k]) for k in saved)


@pytest.mark.slow
def test_two_processes_hold_the_same_weights_and_resume_to_them(shapes, tmp_path):
    from helpers.runs import dist_train_args
    ref, killed = tmp_path / 'ref', tmp_path / 'killed'
    config = _ddp_config(tmp_path, shapes, tmp_path / 'dump_ref', 'ddp_ref.py')
    args, env = dist_train_args(config, ref, *SEED)
    rc, out, _ = run_tool(args, env=env, timeout=TIMEOUT)
    ok(rc, out)
    assert 'Distributed training: True' in out
    _ranks_agree(tmp_path / 'dump_ref', ref / f'iter_{DDP_ITERS}.pth')

    # torchrun and both workers killed after step 3 (past the checkpoint at 2)
    pausing = _ddp_config(tmp_path, shapes, tmp_path / 'dump_killed', 'ddp_pausing.py',
                          dict(type='PauseHook', after_iter=3))
    args, env = dist_train_args(pausing, killed, *SEED)
    rc, out = kill_when_logged(args, f'{PAUSED} 3', env=env, tree=True, timeout=TIMEOUT)
    assert rc == -9, out[-3000:]
    with open(killed / 'last_checkpoint') as f:
        assert f.read().strip() == str(killed / 'iter_2.pth')
    config = _ddp_config(tmp_path, shapes, tmp_path / 'dump_resumed', 'ddp_resumed.py')
    args, env = dist_train_args(config, killed, '--resume', *SEED)
    rc, out, _ = run_tool(args, env=env, timeout=TIMEOUT)
    ok(rc, out)
    assert 'resumed epoch: 0, iter: 2' in out, out[-3000:]
    _ranks_agree(tmp_path / 'dump_resumed', killed / f'iter_{DDP_ITERS}.pth')
    assert max_weight_difference(ref / f'iter_{DDP_ITERS}.pth',
                                 killed / f'iter_{DDP_ITERS}.pth') == 0
    assert train_losses(killed) == train_losses(ref)


# --------------------------------------------------------------------------- time budget, DDP

def _budget_rank(rank, port, skew_s, results):
    """One of two gloo processes running TimeBudgetHook on a stand-in runner; once
    training has started, rank 1's clock jumps ``skew_s`` ahead (its own reading of the
    budget is used up: a process that started its clock earlier, or was held up)."""
    from types import SimpleNamespace
    from unittest import mock

    import torch
    import torch.distributed as dist

    from mmplugin_inline.engine import TimeBudgetHook
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    try:
        offset = [0.0]
        with mock.patch.object(time, 'monotonic', lambda: time.perf_counter() + offset[0]):
            group = dict(params=[torch.zeros(1)], lr=0.1)
            loop = SimpleNamespace(max_iters=100, _max_iters=100)
            runner = SimpleNamespace(iter=0, train_loop=loop, logger=mock.Mock(),
                                     optim_wrapper=SimpleNamespace(
                                         optimizer=SimpleNamespace(param_groups=[group])))
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
def test_time_budget_follows_rank_0_clock_under_ddp():
    import torch.multiprocessing as mp

    from helpers.runs import free_port
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_budget_rank, args=(free_port(), 1000.0, results), nprocs=2)
        rank0, rank1 = results[0], results[1]
    # rank 1's own clock is past the 30 s budget: alone it would stop after one iteration
    assert rank0[0][1] > 1
    assert rank1 == rank0  # the same learning rates and iteration ceilings on both


# --------------------------------------------------------------------------- epochs, in process

class _NoisyData:
    """Six samples whose second feature is drawn from numpy's global generator, as an
    augmentation draws it."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        import numpy as np
        import torch
        return dict(inputs=torch.tensor([float(i), np.random.rand()]))


def _epoch_runner(work, max_epochs, hooks, load_from=None):
    import torch
    import torch.nn as nn
    from mmengine.evaluator import BaseMetric
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Dropout(BaseModel):  # draws from torch's global generator
        def __init__(self):
            super().__init__()
            self.fc, self.drop = nn.Linear(2, 1), nn.Dropout(0.5)

        def forward(self, inputs, data_samples=None, mode='tensor'):
            out = self.fc(self.drop(inputs))
            return dict(loss=out.square().mean()) if mode == 'loss' else [dict()] * len(out)

    class Nothing(BaseMetric):
        def process(self, data_batch, data_samples):
            self.results.append(0)

        def compute_metrics(self, results):
            return dict(n=len(results))

    torch.manual_seed(0)  # the model is built here, before the Runner seeds the generators
    model = Dropout()
    loader = dict(dataset=_NoisyData(), batch_size=2, collate_fn=dict(type='default_collate'),
                  sampler=dict(type='DefaultSampler', shuffle=True))
    return Runner(
        model=model, work_dir=str(work), train_dataloader=loader,
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs, val_interval=1),
        val_dataloader=dict(loader, sampler=dict(type='DefaultSampler', shuffle=False)),
        val_cfg=dict(), val_evaluator=[Nothing()],
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1)),
        custom_hooks=hooks, randomness=dict(seed=3, deterministic=True),
        resume=load_from is not None, load_from=load_from)


def test_an_epoch_loop_resumes_to_the_same_weights_with_the_random_state(tmp_path):
    """Epoch loop with validation after each epoch: the random state is restored at the
    start of the next epoch; without the hook the resumed run draws other numbers."""
    import torch
    from mmengine.registry import DefaultScope

    import mmplugin_inline  # noqa: F401  (the hook, and the checkpoints' allow-list)
    hook = [dict(type='mmplugin_inline.RandomStateHook')]
    with DefaultScope.overwrite_default_scope('mmengine'):
        _epoch_runner(tmp_path / 'ref', 3, hook).train()
        _epoch_runner(tmp_path / 'cut', 1, hook).train()
        first = str(tmp_path / 'cut' / 'epoch_1.pth')
        _epoch_runner(tmp_path / 'cut', 3, hook, load_from=first).train()
        _epoch_runner(tmp_path / 'plain', 3, [], load_from=first).train()
    ref, cut, plain = (torch.load(tmp_path / d / 'epoch_3.pth', weights_only=True)['state_dict']
                       for d in ('ref', 'cut', 'plain'))
    assert all(torch.equal(ref[k], cut[k]) for k in ref)
    assert not all(torch.equal(ref[k], plain[k]) for k in ref)
