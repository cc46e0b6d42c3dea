"""The whole-model race's helpers: the interleaved timing helper (with fake calls and a
fake clock), the extrapolation that predicts a case's time, and the synthetic training
batch."""
import pytest
import torch

from mmplugin_inline.analysis.codebase import dummy_train_batch
from mmplugin_inline.analysis.measure import extrapolate, interleaved_times


class FakeClock:
    """A clock that only the fake calls advance."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_calls(clock, order, seconds):
    def make(name):
        def call():
            order.append(name)
            clock.now += seconds[name]() if callable(seconds[name]) else seconds[name]
        return call
    return {name: make(name) for name in seconds}


def test_interleaved_times_alternates_the_calls_round_by_round():
    clock, order = FakeClock(), []
    calls = fake_calls(clock, order, {'ours': 2.0, 'peer': 3.0, 'ref': 0.5})
    ref = calls.pop('ref')
    out = interleaved_times(calls, repeats=3, reference=ref, warmup=1, clock=clock)
    assert order == ['ref', 'ours', 'peer'] * 4          # one warm-up round, three timed
    assert out.times == {'ours': [2.0] * 3, 'peer': [3.0] * 3}
    assert out.reference == [0.5] * 3 and out.over_cap == []


def test_interleaved_times_times_a_call_over_the_cap_once():
    clock, order = FakeClock(), []
    slow = iter([10.0, 1.0, 1.0])                        # the warm-up is the slow call
    calls = fake_calls(clock, order, {'fast': 1.0, 'slow': lambda: next(slow)})
    out = interleaved_times(calls, repeats=2, warmup=2, max_warmup_s=5.0, clock=clock)
    assert order == ['fast', 'slow', 'fast', 'fast', 'fast']
    assert out.over_cap == ['slow'] and out.times['slow'] == [10.0]
    assert out.times['fast'] == [1.0, 1.0]
    with pytest.raises(ValueError):
        interleaved_times(calls, repeats=0)


def test_extrapolate_on_log_log_axes():
    assert extrapolate([], 10) is None
    assert extrapolate([(100, 1.0)], 200) == pytest.approx(4.0)       # default slope 2
    assert extrapolate([(100, 1.0), (400, 4.0)], 800) == pytest.approx(8.0)   # slope 1
    # a slope below the minimum (fixed costs at small sizes) counts as linear
    assert extrapolate([(100, 1.0), (400, 1.1)], 800) == pytest.approx(2.2)


def test_synthetic_training_batches_carry_ground_truth():
    seg = dummy_train_batch('mmseg', (61, 77), num_classes=150, batch_size=2)
    gt = seg['data_samples'][1].gt_sem_seg.data
    assert gt.shape == (1, 61, 77) and gt.dtype == torch.long and 0 <= gt.min() <= gt.max() < 150
    det = dummy_train_batch('mmdet', (61, 77), num_classes=80, instances=3)
    inst = det['data_samples'][0].gt_instances
    boxes = inst.bboxes.tensor
    assert boxes.shape == (3, 4) and (boxes[:, 2:] > boxes[:, :2]).all()
    assert (boxes[:, 2] <= 77).all() and (boxes[:, 3] <= 61).all() and (boxes >= 0).all()
    assert inst.masks.masks.shape == (3, 61, 77) and inst.masks.masks.sum((1, 2)).min() > 0
    assert inst.labels.max() < 80 and len(det['inputs']) == 2
