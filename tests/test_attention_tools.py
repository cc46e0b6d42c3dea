"""The attention analysis tools: benchmark and injectivity demonstration."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'tools', 'analysis_tools'))
import benchmark_attention  # noqa: E402
import injectivity  # noqa: E402


def _is_png(path):
    with open(path, 'rb') as f:
        return f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_benchmark_writes_json_plot_and_ratio_table(tmp_path, capsys):
    results = benchmark_attention.main(['--quick', '--out-dir', str(tmp_path)])
    data = json.load(open(tmp_path / 'benchmark_attention.json'))
    assert [r['n'] for r in data['results']] == [256, 960]
    for row in data['results']:
        for mode in ('forward', 'forward+backward'):
            assert set(row[mode]) == set(benchmark_attention.IMPLS)
            assert all(v['time_ms'] > 0 for v in row[mode].values())
        assert row['forward+backward']['softmax (naive)']['peak_mb'] > \
            row['forward+backward']['inline (ours)']['peak_mb']
    assert _is_png(tmp_path / 'benchmark_attention.png')
    assert 'authors/ours fwd' in capsys.readouterr().out
    assert len(results) == 2


def test_quadratic_implementations_are_skipped_beyond_their_limits():
    assert not benchmark_attention.fits('softmax (naive)', 200 * 336, 2, 1, 4.0, 10 ** 9)
    assert not benchmark_attention.fits('softmax (SDPA)', 200 * 336, 2, 1, 4.0, 128 * 128)
    assert benchmark_attention.fits('inline (ours)', 256 * 256, 4, 1, 4.0, 1)


def test_injectivity_linear_collapses_different_queries_inline_does_not(tmp_path):
    cases = injectivity.main(['--size', '9', '11', '--out-dir', str(tmp_path)])
    assert len(cases) == 4
    for row in cases:
        assert row['linear'] < 1e-9, row       # same distribution (up to the eps guard)
        assert row['inline'] > 1e-4, row       # InLine tells them apart
    assert _is_png(tmp_path / 'attention_maps.png')
