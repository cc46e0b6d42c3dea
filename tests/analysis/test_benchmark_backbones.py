"""The backbone race (mmplugin_inline.analysis.backbone_benchmark, run by
tools/analysis_tools/benchmark_backbones.py) on tiny cases: the race's outputs (JSON,
table, plots), the with_cp rows, the skip rule and the Swin window sweep's windows."""
import json

import pytest
import torch

from mmplugin_inline.analysis import backbone_benchmark as bench
from mmplugin_inline.cli import benchmark_backbones as bench_tool


@pytest.mark.slow
def test_a_quick_run_writes_the_table_json_and_plots(tmp_path):
    out = bench_tool.main(['--families', 'pvt', '--sizes', '32x32', '48x64', '--modes', 'infer',
                      'train', '--with-cp', 'none', 'mlp', '--repeats', '1',
                      '--gemm-size', '128', '--max-call-s', '1e6',
                      '--out-dir', str(tmp_path)])
    rows = out['results']
    # infer: ours and mmdet's PVT-T; train: also ours with with_cp='mlp'; two sizes each
    assert len(rows) == 2 * (2 + 3)
    assert {(r['model'], r['mode']) for r in rows} == {
        ('InLine-PVT-T', 'infer'), ('PVT-T (mmdet)', 'infer'), ('InLine-PVT-T', 'train'),
        ('PVT-T (mmdet)', 'train'), ('InLine-PVT-T with_cp=mlp', 'train')}
    for r in rows:
        assert r['time_ms'] > 0 and r['peak_mb'] > 0 and r['gflops'] > 0
        assert r['gflop_per_s'] > 0 and r['of_gemm'] > 0
    ours = {(r['size'], r['mode']): r for r in rows if r['model'] == 'InLine-PVT-T'}
    cp = {r['size']: r for r in rows if r['model'] == 'InLine-PVT-T with_cp=mlp'}
    # a training step is counted as three forwards; recomputation changes no count
    assert ours['32x32', 'train']['gflops'] == pytest.approx(3 * ours['32x32', 'infer']['gflops'])
    assert ours['48x64', 'infer']['gflops'] > ours['32x32', 'infer']['gflops']
    assert cp['48x64']['gflops'] == ours['48x64', 'train']['gflops']
    saved = json.loads((tmp_path / 'results.json').read_text())
    assert len(saved['results']) == len(rows) and saved['env']['gemm_gflop_per_s'] > 0
    table = (tmp_path / 'results.md').read_text()
    assert '| pvt | 48x64 | train |' in table and '| InLine-PVT-T | 48x64 | mlp |' in table
    assert 'fitted slope' in table
    for name in ('time_vs_pixels.png', 'memory_vs_pixels.png'):
        assert (tmp_path / name).read_bytes()[:4] == b'\x89PNG'


def test_sizes_predicted_over_the_caps_are_skipped_with_the_reason():
    history = [dict(pixels=100, time_ms=10.0, peak_mb=10.0),
               dict(pixels=400, time_ms=160.0, peak_mb=40.0)]      # time ~ pixels^2
    assert bench.predicted_over(history, 800, max_s=1.0, max_mb=1e6) is None   # 0.64 s
    assert 'max-call-s' in bench.predicted_over(history, 1600, max_s=1.0, max_mb=1e6)
    # memory extrapolates from its own points (here linear: 80 MiB at 800 pixels)
    assert bench.predicted_over(history, 800, max_s=1e3, max_mb=100) is None
    assert 'max-memory-gb' in bench.predicted_over(history, 800, max_s=1e3, max_mb=50)
    # from one measured size: memory linear in the pixels, time quadratic (the cautious
    # guesses; a training step at 224 once predicted 45 GiB at 800x1344, measured 1.6)
    one = history[:1]
    assert bench.predicted_over(one, 800, max_s=0.5, max_mb=1e6) is not None   # 0.64 s
    assert bench.predicted_over(one, 800, max_s=1.0, max_mb=81) is None         # 80 MiB
    assert 'max-memory-gb' in bench.predicted_over(one, 800, max_s=1.0, max_mb=79)
    assert bench.predicted_over([], 10 ** 9, max_s=1e-3, max_mb=1) is None


def test_window_sweep_cuts_windows_to_each_stage_map():
    models = bench.window_models(28, (112, 112))                 # stage maps 28, 14, 7, 4
    for name, model in models.items():
        sizes = [stage.blocks[0].attn.window_size for stage in model.stages]
        assert sizes == [28, 14, 7, 4], name
        with torch.no_grad():
            outs = model.eval()(torch.randn(1, 3, 112, 112))
        assert [o.shape[-1] for o in outs] == [28, 14, 7, 4]


def test_reference_paths_race_beside_the_fast_paths(tmp_path, monkeypatch):
    """--reference-paths adds our model on the reference paths (same weights), and its
    calls really run there: the switch is seen off inside them, on outside."""
    from mmplugin_inline import core
    seen = []
    real = core.local_residual_nhwc

    def spy(*args):
        seen.append(core.fast_paths_enabled())
        return real(*args)
    monkeypatch.setattr('mmplugin_inline.models.layers.mixers.local_residual_nhwc', spy)
    out = bench_tool.main(['--families', 'swin', '--sizes', '32x32', '--modes', 'infer',
                      '--repeats', '1', '--gemm-size', '64', '--max-call-s', '1e6',
                      '--no-memory', '--no-flops', '--no-plots', '--reference-paths',
                      '--out-dir', str(tmp_path)])
    names = {r['model'] for r in out['results']}
    assert names == {'InLine-Swin-T', 'Swin-T w7 (mmdet)', 'InLine-Swin-T (reference paths)'}
    assert True in seen and False in seen      # calls on both paths, in one run
    assert core.fast_paths_enabled()
    table = (tmp_path / 'results.md').read_text()
    assert 'speed-up (reference / fast)' in table and '| swin | 32x32 | infer |' in table


def test_paper_fig3_runs_on_the_cpu_with_small_sizes(tmp_path):
    """--paper-fig3 with the sizes and windows made small: DeiT-T against InLine-DeiT-T per
    size, Swin-T against InLine-Swin-T per window, fp32 and bf16 autocast (the CPU's stand-in
    for fp16, stated), images/s and the measured ratio of each, in the JSON and the table."""
    out = bench_tool.main(['--paper-fig3', '--fig3-sizes', '48', '--fig3-windows', '4',
                           '--fig3-input', '32', '--repeats', '1', '--device', 'cpu',
                           '--out-dir', str(tmp_path)])
    rows = out['paper_fig3']
    assert [(r['comparison'], r['setting'], r['precision']) for r in rows] == [
        (c, s, p) for c, s in (('deit', '48x48'), ('swin', 'window 4')) for p in ('fp32', 'bf16')]
    for r in rows:
        assert r['batch'] == 1 and r['softmax_ips'] > 0 and r['inline_ips'] > 0
        assert r['ratio'] == pytest.approx(r['inline_ips'] / r['softmax_ips'])
    saved = json.loads((tmp_path / 'results.json').read_text())
    assert saved['paper_fig3'] == json.loads(json.dumps(rows))
    assert saved['env']['batch'] == 1 and 'bf16 autocast stands in' in saved['env'][
        'precision_note']
    table = (tmp_path / 'results.md').read_text()
    assert '| DeiT-T vs InLine-DeiT-T | 48x48 | bf16 |' in table
    assert '| Swin-T vs InLine-Swin-T | window 4 | fp32 |' in table
    assert 'at batch 1' in table


def test_the_fig3_table_puts_the_papers_ratio_beside_the_measured_one():
    from mmplugin_inline.analysis.backbone_report import fig3_markdown
    env = dict(device='cuda (H100)', torch='2.6.0', batch=16, repeats=5,
               precision_note='fp16: autocast')
    rows = [dict(comparison=c, setting=s, precision='fp16', softmax_ips=100.0,
                 inline_ips=100.0 * k, ratio=k)
            for c, s, k in (('deit', '224x224', 0.9), ('deit', '640x640', 2.2),
                            ('deit', '1024x1024', 5.0), ('swin', 'window 7', 0.95),
                            ('swin', 'window 28', 2.0), ('swin', 'window 56', 3.5))]
    rows.append(dict(comparison='deit', setting='1024x1024', precision='fp32',
                     softmax_ips=None, inline_ips=None, ratio=None,
                     note='out of memory at batch 16'))
    table = fig3_markdown(rows, env).splitlines()
    assert 'batch 16' in table[0] and 'median of 5' in table[0]
    assert '| DeiT-T vs InLine-DeiT-T | 224x224 | fp16 | 100.0 | 90.0 | 0.90x | - |' in table
    assert '| DeiT-T vs InLine-DeiT-T | 640x640 | fp16 | 100.0 | 220.0 | 2.20x | 2.4x |' in table
    assert '| DeiT-T vs InLine-DeiT-T | 1024x1024 | fp16 | 100.0 | 500.0 | 5.00x | 4.8x |' in table
    assert '| Swin-T vs InLine-Swin-T | window 28 | fp16 | 100.0 | 200.0 | 2.00x | 1.9x |' in table
    assert '| Swin-T vs InLine-Swin-T | window 56 | fp16 | 100.0 | 350.0 | 3.50x | 3.7x |' in table
    assert '| DeiT-T vs InLine-DeiT-T | 1024x1024 | fp32 | - | - | out of memory at batch 16 ' \
           '| 4.8x |' in table


def test_fig3_precisions_per_device():
    assert bench.fig3_precisions('cpu')[0] == ['fp32', 'bf16']
    precisions, note = bench.fig3_precisions('cpu', ['fp32', 'fp16'])
    assert precisions == ['fp32'] and 'skipped here: fp16' in note
