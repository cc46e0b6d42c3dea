"""The whole-model race (mmplugin_inline.analysis.model_race, behind
tools/analysis_tools/benchmark_models.py): the interleaved timing helper, the options,
the cases and the skip rule, the tables from made-up rows, the pairs' configs, the
synthetic training batch, and one tiny run of the shrunk Semantic FPN pair."""
import argparse
import copy
import json
import sys

import pytest
import torch

from helpers.runs import run_tool
from helpers.tiny_models import shrink_model
from mmplugin_inline.analysis import model_race as race
from mmplugin_inline.analysis import model_race_pairs as pairs
from mmplugin_inline.analysis import model_race_report as race_report
from mmplugin_inline.analysis.measure import extrapolate, interleaved_times
from mmplugin_inline.analysis.model_and_batch import dummy_train_batch
from mmplugin_inline.cli import benchmark_models as race_tool


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


def parse(argv):
    parser = argparse.ArgumentParser()
    race_tool.add_race_options(parser)
    return parser.parse_args(argv)


def test_options_defaults_sizes_and_checks(capsys):
    args = parse([])
    assert args.pairs == ['upernet-swin', 'fpn-pvt', 'mask-rcnn-pvt']
    assert args.sizes == [(512, 512), (1024, 1024), (1024, 2048)]
    assert (args.train_size, args.train_batch, args.repeats, args.warmup) == ((512, 512), 2, 2, 1)
    assert (args.slide_crop, args.slide_stride) == ((1024, 1024), (768, 768))
    assert race_tool.check_race_args(args) is None
    args = parse(['--pairs', 'fpn-pvt', '--sizes', '64', '48x96', '--repeats', '0'])
    assert args.pairs == ['fpn-pvt'] and args.sizes == [(64, 64), (48, 96)]
    assert '--repeats' in race_tool.check_race_args(args)
    assert '--detections' in race_tool.check_race_args(parse(['--detections', '0']))
    for bad in (['--sizes', '12y'], ['--sizes', '0x5'], ['--pairs', 'deit']):
        with pytest.raises(SystemExit):
            parse(bad)
    assert 'HxW' in capsys.readouterr().err


def test_the_tool_checks_its_options():
    rc, out, _ = run_tool([sys.executable, 'tools/analysis_tools/benchmark_models.py',
                           '--repeats', '0'], timeout=120)
    assert rc == 2 and '--repeats must be at least 1' in out


def test_cases_slide_only_for_segmentors_larger_than_a_crop():
    sizes = [(1024, 2048), (512, 512), (1024, 1024)]
    seg = race.race_cases('mmseg', sizes, (512, 512), 2, (1024, 1024))
    assert [(c.kind, c.size_text, c.mode, c.batch) for c in seg] == [
        ('infer', '512x512', 'whole', 1), ('infer', '1024x1024', 'whole', 1),
        ('infer', '1024x2048', 'whole', 1), ('infer', '1024x2048', 'slide', 1),
        ('train', '512x512', 'train', 2)]
    det = race.race_cases('mmdet', sizes, None, 2, (1024, 1024))
    assert [c.mode for c in det] == ['whole'] * 3
    assert race.slide_crops((1024, 2048), (1024, 1024), (768, 768)) == 3
    assert race.slide_crops((512, 512), (1024, 1024), (768, 768)) == 1


def test_predicted_times_from_the_whole_inference_calls():
    measured = {('infer', 'whole'): [(512 * 512, 1.0), (1024 * 1024, 4.0)]}      # linear
    crop, stride = (1024, 1024), (768, 768)
    whole = race.Case('infer', (1024, 2048), 'whole')
    slide = race.Case('infer', (1024, 2048), 'slide')
    train = race.Case('train', (512, 512), 'train', 2)
    assert race.predicted_seconds(whole, measured, crop, stride) == pytest.approx(8.0)
    assert race.predicted_seconds(slide, measured, crop, stride) == pytest.approx(12.0)
    assert race.predicted_seconds(train, measured, crop, stride) == pytest.approx(
        race.TRAIN_OVER_INFER * 2 * 1.0)
    assert race.predicted_seconds(whole, {}, crop, stride) is None
    # a case predicted over the cap is skipped without building a call
    args = parse(['--max-call-s', '5'])
    row = race.race_case(pairs.PAIRS['fpn-pvt'], models=None, codebase='mmseg', case=whole,
                         num_classes=150, options=race_tool.race_options(args),
                         measured=measured)
    assert row['ours_s'] is None and row['note'].startswith('skipped: predicted 8 s')


def fake_row(size, mode, ours, peer, kind='infer', **extra):
    row = dict(pair='fpn-pvt', ours='Semantic FPN InLine-PVT-T', peer='Semantic FPN PVT-T',
               kind=kind, size=size, mode=mode, ours_s=ours, peer_s=peer, ours_peak_mb=100.0,
               peer_peak_mb=200.0, note='')
    row.update(extra)
    return row


def test_tables_from_made_up_rows():
    rows = [fake_row('1024x2048', 'whole', 2.0, 5.0),
            fake_row('1024x2048', 'slide', 3.0, 6.0, crops=3),
            fake_row('512x512', 'train', None, None, kind='train',
                     note='skipped: predicted 700 s a call > --max-call-s')]
    env = dict(device='cpu', threads=2, torch='x', repeats=2, warmup=1, train_batch=2,
               load_start='1.0', load_end='1.0', detections=100)
    table = race_report.markdown(rows, env)
    assert '| Semantic FPN InLine-PVT-T vs Semantic FPN PVT-T | infer | 1024x2048 | whole | ' \
           '2.000 | 5.000 | 2.50x | 100 / 200 |  |' in table
    assert '| train | 512x512 | train | - | - | - | 100 / 200 | skipped: predicted 700 s' in table
    # whole vs slide: ours 3 / 2, peer 6 / 5, the softmax model sliding / our whole pass 6 / 2
    assert '| 1024x2048 | 3 | 2.000 | 3.000 | 1.50 | 5.000 | 6.000 | 1.20 | 3.00x |' in table
    assert 'Training step: batch 2' in table and 'keep 100 detections' in table


@pytest.mark.parametrize('key', sorted(pairs.PAIRS))
def test_pair_configs_swap_only_the_backbone_and_read_no_weights(key):
    pair = pairs.PAIRS[key]
    ours, peer = pairs.pair_configs(pair)
    assert ours.model.backbone.type.startswith('InLine') and ours.model.backbone.init_cfg is None
    assert peer.model.backbone.type == pair.peer_backbone['type']
    assert peer.model.backbone.init_cfg is None and ours.model.get('pretrained') is None
    rest = {k: v for k, v in ours.model.items() if k != 'backbone'}
    assert rest == {k: v for k, v in peer.model.items() if k != 'backbone'}
    assert pairs.backbone_channels(peer.model) == pair.channels


@pytest.mark.parametrize('key', ['upernet-swin', 'fpn-pvt'])
def test_peer_backbones_give_the_channels_the_heads_take(key):
    """The full-size peers, built from the segmentor's (mmseg) registry as the pair's
    config does: mmdet's PVT-T across scopes, mmseg's Swin-T."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    pair = pairs.PAIRS[key]
    backbone = MODELS.build(dict(pair.peer_backbone, init_cfg=None))
    backbone.eval()  # mmseg's Swin's train() returns None
    with torch.no_grad():
        outs = backbone(torch.randn(1, 3, 64, 64))
    assert tuple(o.shape[1] for o in outs) == pair.channels


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


def tiny_pair(key):
    """The pair's configs with our backbone shrunk (tests/helpers) and a peer backbone of
    the same tiny widths (16-32-64-128)."""
    pair = pairs.PAIRS[key]
    ours, peer = pairs.pair_configs(pair)
    model = ours.model.to_dict()
    shrink_model(model)
    ours.model = model
    peer_model = copy.deepcopy(model)
    tiny = dict(embed_dims=16, num_heads=[1, 2, 4, 8], init_cfg=None)
    if 'Swin' in pair.peer_backbone['type']:
        tiny.update(depths=[1, 1, 1, 1])
    else:
        tiny.update(num_layers=[1, 1, 1, 1], mlp_ratios=[2, 2, 2, 2])
    peer_model['backbone'] = dict(pair.peer_backbone, **tiny)
    peer.model = peer_model
    return ours, peer


def test_a_tiny_race_of_the_semantic_fpn_pair(tmp_path):
    args = parse(['--pairs', 'fpn-pvt', '--sizes', '64x64', '64x96', '--train-size', '64x64',
                  '--slide-crop', '64', '--slide-stride', '48', '--repeats', '1',
                  '--out-dir', str(tmp_path)])
    out = race.run_race(race_tool.race_options(args), {'fpn-pvt': tiny_pair('fpn-pvt')})
    rows = out['rows']
    assert [(r['kind'], r['size'], r['mode']) for r in rows] == [
        ('infer', '64x64', 'whole'), ('infer', '64x96', 'whole'), ('infer', '64x96', 'slide'),
        ('train', '64x64', 'train')]
    for r in rows:
        assert r['ours_s'] > 0 and r['peer_s'] > 0, r
        assert r['ours_peak_mb'] > 0 and r['peer_peak_mb'] > 0, r
        assert len(r['ours_times']) == len(r['peer_times']) == 1 and not r['note']
    assert rows[2]['crops'] == 2 and rows[3]['batch'] == 2
    saved = json.loads((tmp_path / 'results.json').read_text())
    assert not saved['partial'] and len(saved['rows']) == 4
    table = (tmp_path / 'results.md').read_text()
    assert table == out['table'] and '| 64x96 | slide |' in table and 'Whole against slide' in table


def test_a_call_over_the_cap_is_timed_once_and_larger_cases_are_skipped(tmp_path):
    args = parse(['--pairs', 'fpn-pvt', '--sizes', '64x64', '64x96', '--no-train',
                  '--slide-crop', '64', '--max-call-s', '1e-6', '--out-dir', str(tmp_path)])
    rows = race.run_race(race_tool.race_options(args), {'fpn-pvt': tiny_pair('fpn-pvt')})['rows']
    first, *rest = rows
    assert len(first['ours_times']) == len(first['peer_times']) == 1
    assert first['ours_s'] > 0 and first['ours_peak_mb'] is None
    assert first['note'].startswith('ours and peer: one timed call')
    assert [(r['size'], r['mode']) for r in rest] == [('64x96', 'whole'), ('64x96', 'slide')]
    assert all(r['note'].startswith('skipped: predicted') and r['ours_s'] is None for r in rest)
