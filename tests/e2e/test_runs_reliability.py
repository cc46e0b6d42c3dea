"""Long runs: two runs with one seed train alike, a run killed with SIGKILL and resumed
ends with the weights of one that was not, a save cut short is never resumed from, and
two processes hold the same weights. Real ``tools/train.py`` runs on CPU, ours and the one
the mmdet wheel ships (the units of resuming, in process: tests/engine/test_resume.py)."""
import os
import os.path as osp

import pytest

from helpers.run_hooks import PAUSED
from helpers.runs import (
    PYTHON,
    kill_when_logged,
    max_weight_difference,
    ok,
    run_tool,
    train_losses,
    work_dir_of_a_cut_save,
)
from helpers.tiny_models import REPO
from helpers.tool_configs import resumable_mask_rcnn

# one pytest-xdist worker runs this file's tests: they share the reference run (a module fixture)
pytestmark = pytest.mark.xdist_group('reliability')

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


def _stock_mmdet_train(config, work, *extra):
    """``tools/train.py CONFIG --work-dir WORK EXTRA...`` of mmdet itself, as its wheel
    ships it (``mmdet/.mim/tools/train.py``, what ``mim train mmdet`` runs)."""
    import mmdet
    script = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')
    assert osp.isfile(script), f'the installed mmdet ships no {script}'
    return [PYTHON, script, str(config), '--work-dir', str(work), *extra]


def _run_stock_mmdet_train(config, work, *extra):
    """:func:`_stock_mmdet_train` as a subprocess: (returncode, output, stderr)."""
    return run_tool(_stock_mmdet_train(config, work, *extra), timeout=TIMEOUT, env=HOOKS_ENV)


@pytest.mark.slow
def test_stock_mmdet_train_killed_between_saves_resumes_through_the_plugins_runner(
        reference, tmp_path):
    """mmdet's own tools/train.py on our config builds the config's runner_type: it saves
    through SafeCheckpointRunner, and its --resume reads the checkpoint with our loader
    and ends with the weights of the uninterrupted run."""
    config, ref = reference
    work = tmp_path / 'stock'
    pausing = _with_hooks(config, 'stock_pausing.py', dict(type='PauseHook', after_iter=4))
    rc, out = kill_when_logged(_stock_mmdet_train(pausing, work, *SEED), f'{PAUSED} 4',
                               timeout=TIMEOUT, env=HOOKS_ENV)
    assert rc == -9, out[-3000:]
    assert f'{PAUSED} 4 (SafeCheckpointRunner)' in out  # the runner that saved iter_3.pth
    with open(work / 'last_checkpoint') as f:
        assert f.read().strip() == str(work / 'iter_3.pth')

    rc, out, _ = _run_stock_mmdet_train(config, work, '--resume', *SEED, 'train_cfg.max_iters=6')
    ok(rc, out)
    assert f'Loads checkpoint by run_policy backend from path: {work}/iter_3.pth' in out
    assert 'resumed epoch: 0, iter: 3' in out
    assert not [n for n in os.listdir(work) if n.endswith('.part')]
    assert max_weight_difference(ref / 'iter_6.pth', work / 'iter_6.pth') == 0
    ours, theirs = train_losses(ref), train_losses(work)
    assert sorted(theirs) == list(range(1, 7))
    assert theirs == {it: ours[it] for it in theirs}


@pytest.mark.slow
def test_stock_mmdet_train_names_a_damaged_last_checkpoint(reference, tmp_path):
    """mmdet's own tools/train.py: --resume of the cut last checkpoint ends with our
    damaged-file message, --resume alone passes over it to the newest sound one."""
    config, ref = reference
    work = tmp_path / 'work'
    work_dir_of_a_cut_save(work, 'iter_9.pth', ref)
    rc, out, _ = _run_stock_mmdet_train(config, work, '--resume', str(work / 'iter_9.pth'),
                                        *SEED)
    assert rc != 0
    last = out.strip().splitlines()[-1]  # a stock tool: a traceback, our error last
    assert last.startswith('mmplugin_inline.weights.errors.DamagedCheckpointError: '), last
    assert 'iter_9.pth is truncated or corrupt' in last
    rc, out, _ = _run_stock_mmdet_train(config, work, '--resume', *SEED, 'train_cfg.max_iters=7')
    ok(rc, out)
    assert f'Auto-resume: skipping {work}/iter_9.pth' in out
    assert 'resumed epoch: 0, iter: 6' in out
    assert osp.isfile(work / 'iter_7.pth')


@pytest.mark.slow
def test_resume_of_a_cut_save_and_an_explicit_damaged_file(reference, tmp_path):
    config, ref = reference
    work = tmp_path / 'work'
    work_dir_of_a_cut_save(work, 'iter_9.pth', ref)
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
