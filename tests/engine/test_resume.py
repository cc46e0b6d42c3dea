"""Resuming, in process: auto-resume picks the newest sound checkpoint, a save cut short
leaves no file under the checkpoint's name, the plugin's runner reads checkpoints with the
plugin's policy, and an epoch loop resumes to the same weights with the random state (the
real runs killed and resumed: tests/e2e/test_runs_reliability.py)."""
import os

import pytest

from helpers.runs import work_dir_of_a_cut_save


@pytest.mark.parametrize('pointer, expected', [
    ('iter_6.pth', 'iter_6.pth'),  # mmengine's order: the .pth first, then last_checkpoint
    ('iter_9.pth', 'iter_6.pth'),  # the pointer names the cut file: the newest sound one
    ('iter_1.pth', 'iter_6.pth'),  # it names a file deleted before the save (max_keep_ckpts)
])
def test_auto_resume_never_picks_a_damaged_or_missing_checkpoint(tmp_path, pointer, expected):
    from mmplugin_inline.engine.runner import latest_sound_checkpoint
    work = tmp_path / 'work'
    work_dir_of_a_cut_save(work, pointer)
    path, skipped = latest_sound_checkpoint(str(work))
    assert path == str(work / expected)
    skipped = dict(skipped)
    if pointer == 'iter_9.pth':
        assert 'truncated' in skipped[str(work / 'iter_9.pth')]
    if pointer == 'iter_1.pth':
        assert 'does not exist' in skipped[str(work / 'iter_1.pth')]


def test_nothing_sound_to_resume_from_starts_afresh(tmp_path):
    from mmengine.config import Config

    from mmplugin_inline.engine.runner import choose_auto_resume
    (tmp_path / 'iter_3.pth').write_bytes(b'')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_3.pth'))
    cfg = Config(dict(resume=True, load_from=None, work_dir=str(tmp_path)))
    choose_auto_resume(cfg)
    assert cfg.resume is False and cfg.load_from is None


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


def _epoch_runner(work, max_epochs, hooks, load_from=None, resume=None, runner_class=None,
                  **extra):
    import torch
    import torch.nn as nn
    from mmengine.evaluator import BaseMetric
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    runner_class = runner_class or Runner

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
    return runner_class(
        model=model, work_dir=str(work), train_dataloader=loader,
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs, val_interval=1),
        val_dataloader=dict(loader, sampler=dict(type='DefaultSampler', shuffle=False)),
        val_cfg=dict(), val_evaluator=[Nothing()],
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1)),
        custom_hooks=hooks, randomness=dict(seed=3, deterministic=True),
        resume=load_from is not None if resume is None else resume, load_from=load_from,
        **extra)


def test_an_epoch_loop_resumes_to_the_same_weights_with_the_random_state(tmp_path):
    """Epoch loop with validation after each epoch: the random state is restored at the
    start of the next epoch; without the hook the resumed run draws other numbers."""
    import torch
    from mmengine.registry import DefaultScope

    import mmplugin_inline  # noqa: F401  (the hook, and the checkpoints' allow-list)
    from mmplugin_inline.weights import load_run_checkpoint
    hook = [dict(type='mmplugin_inline.RandomStateHook')]
    with DefaultScope.overwrite_default_scope('mmengine'):
        _epoch_runner(tmp_path / 'ref', 3, hook).train()
        _epoch_runner(tmp_path / 'cut', 1, hook).train()
        first = str(tmp_path / 'cut' / 'epoch_1.pth')
        _epoch_runner(tmp_path / 'cut', 3, hook, load_from=first).train()
        _epoch_runner(tmp_path / 'plain', 3, [], load_from=first).train()
    # the plugin's loader: on the fork, mmengine's own loads (load_from above) remove from
    # torch's allow-list what they scoped, which is also what the plugin registered there
    ref, cut, plain = (load_run_checkpoint(str(tmp_path / d / 'epoch_3.pth'))['state_dict']
                       for d in ('ref', 'cut', 'plain'))
    assert all(torch.equal(ref[k], cut[k]) for k in ref)
    assert not all(torch.equal(ref[k], plain[k]) for k in ref)


# --------------------------------------------------------------------------- the plugin's runner

def test_the_runners_saves_are_atomic_and_a_save_cut_short_leaves_no_checkpoint(tmp_path):
    """SafeCheckpointRunner writes NAME.part and renames it; a process that dies while
    writing leaves only the .part file, never a truncated file under NAME."""
    from unittest import mock

    from mmengine.registry import DefaultScope

    from mmplugin_inline.engine import SafeCheckpointRunner
    from mmplugin_inline.weights import load_run_checkpoint
    work = tmp_path / 'work'
    with DefaultScope.overwrite_default_scope('mmengine'):
        runner = _epoch_runner(work, 1, [], runner_class=SafeCheckpointRunner)
        runner.train()
    assert sorted(n for n in os.listdir(work) if n.endswith(('.pth', '.part'))) == [
        'epoch_1.pth']
    assert load_run_checkpoint(str(work / 'epoch_1.pth'))['meta']['epoch'] == 1

    def dies_while_writing(checkpoint, filename, **kwargs):
        with open(filename, 'wb') as f:
            f.write(b'PK\x03\x04 half a checkpoint')
        raise KeyboardInterrupt  # the process dies while writing

    # mmengine's Runner.save_checkpoint writes through this module-level function
    with mock.patch('mmengine.runner.runner.save_checkpoint', dies_while_writing), \
            pytest.raises(KeyboardInterrupt):
        runner.save_checkpoint(str(work), 'epoch_2.pth')
    assert sorted(n for n in os.listdir(work) if n.endswith(('.pth', '.part'))) == [
        'epoch_1.pth', 'epoch_2.pth.part']


def test_the_runner_reads_its_checkpoint_with_the_plugins_policy(tmp_path):
    """load_from of a truncated file: our damaged-file error (mmengine's plain runner
    gives torch's own); the config keys ``verify_hash`` and ``allow_unsafe`` and the
    runner's ``allow_unsafe`` (what --allow-unsafe sets) reach the loader."""
    import torch
    from mmengine.registry import DefaultScope

    from helpers.pickles import writes_marker
    from helpers.runs import truncate
    from mmplugin_inline.engine import SafeCheckpointRunner
    from mmplugin_inline.weights import (
        DamagedCheckpointError,
        UnsafeCheckpointError,
        load_run_checkpoint,
    )

    def load(path, runner_class=SafeCheckpointRunner, unsafe_runner=False, **cfg):
        runner = _epoch_runner(tmp_path / f'run{len(os.listdir(tmp_path))}', 1, [],
                               load_from=str(path), resume=False, runner_class=runner_class,
                               cfg=cfg)
        if unsafe_runner:
            runner.allow_unsafe = True
        runner.load_or_resume()

    with DefaultScope.overwrite_default_scope('mmengine'):
        _epoch_runner(tmp_path / 'first', 1, [], runner_class=SafeCheckpointRunner).train()
        good = tmp_path / 'first' / 'epoch_1.pth'
        cut = tmp_path / 'cut.pth'
        cut.write_bytes(good.read_bytes())
        truncate(cut)
        with pytest.raises(DamagedCheckpointError, match='cut.pth is truncated or corrupt'):
            load(cut)
        with pytest.raises(Exception) as raw:  # the stock runner: torch's own error
            load(cut, runner_class=None)
        assert not isinstance(raw.value, DamagedCheckpointError)

        # a published name whose hash does not match: refused, unless verify_hash=False
        renamed = tmp_path / 'epoch-0badc0de.pth'
        renamed.write_bytes(good.read_bytes())
        with pytest.raises(DamagedCheckpointError, match='0badc0de'):
            load(renamed)
        load(renamed, verify_hash=False)

        # a file that would run code: refused, unless allow_unsafe=True (--allow-unsafe)
        marker = tmp_path / 'marker'
        evil = tmp_path / 'evil.pth'
        torch.save(dict(load_run_checkpoint(str(good)), x=writes_marker(marker)), evil)
        with pytest.raises(UnsafeCheckpointError):
            load(evil)
        assert not marker.exists()
        load(evil, allow_unsafe=True)
        assert marker.read_text() == 'ran'
        marker.unlink()
        load(evil, unsafe_runner=True)
        assert marker.read_text() == 'ran'
