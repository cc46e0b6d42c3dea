"""The attention analysis tools: benchmark and injectivity demonstration."""
import json
import os
import subprocess
import sys

import pytest

from helpers.paths import REPO
from mmplugin_inline.analysis import attention_benchmark
from mmplugin_inline.cli import benchmark_attention as benchmark_attention_tool
from mmplugin_inline.cli import injectivity

ROOT = REPO


def _is_png(path):
    with open(path, 'rb') as f:
        return f.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.slow
def test_benchmark_writes_json_plot_and_ratio_table(tmp_path, capsys):
    results = benchmark_attention_tool.main(['--quick', '--out-dir', str(tmp_path)])
    data = json.load(open(tmp_path / 'benchmark_attention.json'))
    assert [r['n'] for r in data['results']] == [256, 1024]
    assert data['meta']['allocator'] in ('keep (mallopt)', 'default')
    assert isinstance(data['meta']['huge_pages'], bool)
    for row in data['results']:
        for mode in ('forward', 'forward+backward'):
            assert set(row[mode]) == set(attention_benchmark.IMPLS)
            assert all(v['time_ms'] > 0 and v['page_faults'] >= 0 for v in row[mode].values())
        assert row['forward+backward']['softmax (naive)']['peak_mb'] > \
            row['forward+backward']['inline (ours)']['peak_mb']
    assert _is_png(tmp_path / 'benchmark_attention.png')
    out = capsys.readouterr().out
    assert 'authors/ours fwd' in out
    # 32x32 has 4x the tokens of 16x16: that pair is timed again, sizes alternating
    [lin] = data['linearity']
    assert (lin['small'], lin['large']) == ('16x16', '32x32')
    assert set(lin['forward']) == set(lin['forward+backward']) == set(attention_benchmark.IMPLS)
    assert all(r > 0 for r in lin['forward'].values())
    rows = [line for line in out.splitlines() if line.startswith('| 32x32 / 16x16 |')]
    assert len(rows) == len(attention_benchmark.IMPLS)
    assert all(float(r.split('|')[5]) > 0 for r in rows)
    assert len(results) == 2


def _last_line_of_fresh_python(code, *args, **env):
    """Run ``code`` in a new interpreter (allocator state and torch's start-up
    settings are per process) with extra environment variables; its last output line."""
    res = subprocess.run([sys.executable, '-c', code, *args], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, **env), timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_keep_freed_memory_stops_page_faults_on_reallocation():
    """In a fresh process (allocator state is per process): 64 MiB tensors allocated
    again and again fault on every page with glibc's defaults; kept, at most the odd
    one lands on fresh pages (the heap's layout varies from run to run)."""
    code = """
import sys, torch
from mmplugin_inline.analysis import keep_freed_memory, minor_page_faults
if sys.argv[1] == 'keep' and not keep_freed_memory():
    print('unsupported'); sys.exit()
for _ in range(3):
    torch.ones(16 << 20)
before = minor_page_faults()
for _ in range(8):
    torch.ones(16 << 20)
print(minor_page_faults() - before)
"""
    faults = {}
    for mode in ('default', 'keep'):
        last = _last_line_of_fresh_python(code, mode)
        if last == 'unsupported':
            pytest.skip('not glibc')
        faults[mode] = int(last)
    pages = 8 * (64 << 20) // 4096
    assert faults['default'] > pages // 2, faults     # every allocation faults its pages in
    assert faults['keep'] <= pages // 4, faults       # reused: 2 of 8 at most fault


def _thp_mode():
    try:
        with open('/sys/kernel/mm/transparent_hugepage/enabled') as f:
            return f.read().split('[')[1].split(']')[0]
    except (OSError, IndexError):
        return None


@pytest.mark.slow
def test_huge_pages_are_detected_when_torch_is_told_to_use_them():
    """torch reads THP_MEM_ALLOC_ENABLE once, so each case runs in a fresh process."""
    mode = _thp_mode()
    if mode not in ('madvise', 'always'):
        pytest.skip(f'transparent huge pages unavailable here ({mode})')
    code = 'from mmplugin_inline.analysis import huge_pages_in_use; print(huge_pages_in_use())'
    seen = {flag: _last_line_of_fresh_python(code, THP_MEM_ALLOC_ENABLE=flag)
            for flag in ('0', '1')}
    assert seen['1'] == 'True', seen
    if mode == 'madvise':  # only pages torch asks for are huge
        assert seen['0'] == 'False', seen


def test_linearity_pairs_are_maps_with_four_times_the_tokens():
    pairs = attention_benchmark.linearity_pairs(['56x56', '128x128', '200x336', '256x256',
                                                 '112x112', '64x256'])
    assert pairs == [('56x56', '112x112'), ('128x128', '256x256'), ('64x256', '256x256')]


def test_quadratic_implementations_are_skipped_beyond_their_limits():
    assert not attention_benchmark.fits('softmax (naive)', 200 * 336, 2, 1, 4.0, 10 ** 9)
    assert not attention_benchmark.fits('softmax (SDPA)', 200 * 336, 2, 1, 4.0, 128 * 128)
    assert attention_benchmark.fits('inline (ours)', 256 * 256, 4, 1, 4.0, 1)


def test_injectivity_linear_collapses_different_queries_inline_does_not(tmp_path):
    cases = injectivity.main(['--size', '9', '11', '--out-dir', str(tmp_path)])
    assert len(cases) == 4
    for row in cases:
        assert row['linear'] < 1e-9, row       # same distribution (up to the eps guard)
        assert row['inline'] > 1e-4, row       # InLine tells them apart
    assert _is_png(tmp_path / 'attention_maps.png')
    # the layers' own mixers, except plain linear attention with a map it refuses
    assert [(r['kernel'], r['linear_source'], r['inline_source']) for r in cases] == [
        ('relu', 'layer', 'layer'), ('identity', 'definition', 'layer'),
        ('leakyrelu', 'definition', 'layer'), ('exp', 'layer', 'layer')]


@pytest.mark.parametrize('name,kernel', [('inline', 'identity'), ('inline', 'exp'),
                                         ('linear', 'relu'), ('softmax', 'identity')])
def test_injectivity_rows_are_the_mixers_and_the_definition(name, kernel):
    """What the layers compute (output for V = I) is the explicit definition's rows."""
    import torch

    from mmplugin_inline.core import ATTENTION_WEIGHTS
    q, k = injectivity.token_map(5, 7, 16)
    rows, source = injectivity.layer_weights(name, q, k, kernel)
    assert source == 'layer'
    torch.testing.assert_close(rows, ATTENTION_WEIGHTS[name](q, k, kernel=kernel))
