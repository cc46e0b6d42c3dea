"""Long runs: two runs with one seed train alike, a run killed with SIGKILL and resumed
ends with the weights of one that was not, a save cut short is never resumed from, and
two processes hold the same weights. Real ``tools/train.py`` runs on CPU."""
import os
import os.path as osp
import shutil
import time

import pytest

from helpers.runs import (PYTHON, kill_when_logged, max_weight_difference, ok, run_tool,
                          train_losses)
from helpers.tiny_models import REPO
from helpers.tool_configs import resumable_mask_rcnn

ITERS, INTERVAL = 20, 3
SEED = ['--cfg-options', 'randomness.seed=7', 'randomness.deterministic=True']


def _train(config, work, *extra):
    return [PYTHON, osp.join(REPO, 'tools/train.py'), str(config), '--work-dir', str(work),
            *extra]


@pytest.fixture(scope='module')
def reference(shapes, tmp_path_factory):
    """An uninterrupted run: 20 iterations, checkpoints every 3 and at the end."""
    root = tmp_path_factory.mktemp('reliability')
    config = resumable_mask_rcnn(root, shapes + '/', ITERS, INTERVAL)
    work = root / 'reference'
    rc, out, _ = run_tool(_train(config, work, *SEED))
    ok(rc, out)
    return config, work


@pytest.mark.slow
def test_two_runs_with_one_seed_log_the_same_losses(reference, tmp_path):
    config, ref = reference
    rc, out, _ = run_tool(_train(config, tmp_path / 'again', *SEED))
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
    # killed as soon as iteration 4 is logged: past the checkpoint at 3, before the one at 6
    rc, out = kill_when_logged(_train(config, work, *SEED), f'Iter(train) [ 4/{ITERS}]')
    assert rc == -9, out[-3000:]
    assert not osp.exists(work / f'iter_{ITERS}.pth')
    with open(work / 'last_checkpoint') as f:
        saved = int(osp.basename(f.read().strip())[len('iter_'):-len('.pth')])
    logged = max(train_losses(work))
    assert saved < logged  # trained iterations were lost with the process

    rc, out, _ = run_tool(_train(config, work, '--resume', *SEED))
    ok(rc, out)
    assert f'resumed epoch: 0, iter: {saved}' in out
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
    from mmplugin_inline.utils.run_setup import latest_sound_checkpoint
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

    from mmplugin_inline.utils.run_setup import choose_auto_resume
    (tmp_path / 'iter_3.pth').write_bytes(b'')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_3.pth'))
    cfg = Config(dict(resume=True, load_from=None, work_dir=str(tmp_path)))
    choose_auto_resume(cfg)
    assert cfg.resume is False and cfg.load_from is None


def test_a_save_cut_short_leaves_no_file_under_the_checkpoint_name(tmp_path):
    from mmplugin_inline.utils.run_setup import atomic_checkpoint_saves

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
    rc, out, err = run_tool(_train(config, work, '--resume', str(work / 'iter_9.pth'), *SEED))
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert 'iter_9.pth is truncated or corrupt' in err
    # --resume alone: the newest complete checkpoint, then one more iteration
    rc, out, _ = run_tool(_train(config, work, '--resume', *SEED, 'train_cfg.max_iters=7'))
    ok(rc, out)
    assert 'skipping' in out and 'resumed epoch: 0, iter: 6' in out
    assert osp.isfile(work / 'iter_7.pth')


# --------------------------------------------------------------------------- two processes

DDP_ITERS, DDP_INTERVAL = 6, 2


def _ddp_config(root, shapes, dump_dir):
    """The resumable Mask R-CNN for 2 processes (4 images, 1 per process and step: 2 steps
    an epoch); every process saves the state dict it ends with into ``dump_dir``."""
    path = resumable_mask_rcnn(root, shapes + '/', DDP_ITERS, DDP_INTERVAL, name='ddp.py')
    with open(path, 'a') as f:
        f.write("custom_imports = dict(imports=['mmplugin_inline', 'helpers.rank_state'], "
                "allow_failed_imports=False)\n"
                f"custom_hooks = [dict(type='SaveRankStateHook', out_dir={str(dump_dir)!r})]\n")
    return path


def _ranks_agree(dump_dir, checkpoint):
    """Both processes end with the same weights, which rank 0 saved in ``checkpoint``."""
    import torch
    ranks = [torch.load(osp.join(dump_dir, f'rank{r}.pth'), weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
    from mmplugin_inline.loading import load_run_checkpoint
    saved = load_run_checkpoint(str(checkpoint), map_location='cpu')['state_dict']
    assert all(torch.equal(saved[k], ranks[0][k]) for k in saved)


@pytest.mark.slow
def test_two_processes_hold_the_same_weights_and_resume_to_them(shapes, tmp_path):
    from helpers.runs import dist_train_args
    ref, killed = tmp_path / 'ref', tmp_path / 'killed'
    config = _ddp_config(tmp_path, shapes, tmp_path / 'dump_ref')
    args, env = dist_train_args(config, ref, *SEED)
    rc, out, _ = run_tool(args, env=env)
    ok(rc, out)
    assert 'Distributed training: True' in out
    _ranks_agree(tmp_path / 'dump_ref', ref / f'iter_{DDP_ITERS}.pth')

    # torchrun and both workers killed once step 3 is logged (past the checkpoint at 2)
    config = _ddp_config(tmp_path, shapes, tmp_path / 'dump_resumed')
    args, env = dist_train_args(config, killed, *SEED)
    rc, out = kill_when_logged(args, f'Iter(train) [3/{DDP_ITERS}]', env=env, group=True)
    assert rc == -9 and not osp.exists(killed / f'iter_{DDP_ITERS}.pth'), out[-3000:]
    args, env = dist_train_args(config, killed, '--resume', *SEED)
    rc, out, _ = run_tool(args, env=env)
    ok(rc, out)
    assert 'resumed epoch: 0, iter: 2' in out, out[-3000:]
    _ranks_agree(tmp_path / 'dump_resumed', killed / f'iter_{DDP_ITERS}.pth')
    assert max_weight_difference(ref / f'iter_{DDP_ITERS}.pth',
                                 killed / f'iter_{DDP_ITERS}.pth') == 0
    assert train_losses(killed) == train_losses(ref)


# --------------------------------------------------------------------------- time budget, DDP

def _budget_rank(rank, port, skew_s, results):
    """One of two gloo processes running TimeBudgetHook on a stand-in runner; rank 1's
    clock runs ``skew_s`` ahead (a late start, a slower process)."""
    from types import SimpleNamespace
    from unittest import mock

    import torch
    import torch.distributed as dist

    from mmplugin_inline.engine import TimeBudgetHook
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    try:
        offset = skew_s if rank == 1 else 0.0
        with mock.patch.object(time, 'monotonic', lambda: time.perf_counter() + offset):
            group = dict(params=[torch.zeros(1)], lr=0.1)
            loop = SimpleNamespace(max_iters=100, _max_iters=100)
            runner = SimpleNamespace(iter=0, train_loop=loop, logger=mock.Mock(),
                                     optim_wrapper=SimpleNamespace(
                                         optimizer=SimpleNamespace(param_groups=[group])))
            hook = TimeBudgetHook(budget_s=30.0, warmup_iters=0)
            hook.before_train(runner)
            seen = []
            for it in range(3):
                runner.iter = it
                hook.before_train_iter(runner, it)
                hook.after_train_iter(runner, it)
                seen.append((group['lr'], loop._max_iters))
        results[rank] = seen
    finally:
        dist.destroy_process_group()


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
