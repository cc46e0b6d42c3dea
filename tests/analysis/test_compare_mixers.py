"""The mixer comparison tool: variants, seeds, the summary and its verdict."""
import glob
import json
import math
import os.path as osp

import pytest

from helpers.runs import SEG_CONFIG
from helpers.tiny_models import seg_run_config
from mmplugin_inline.analysis.mixer_comparison import Run, Variant, separations, summarise
from mmplugin_inline.cli import compare_mixers


def test_variants_parse_with_and_without_the_local_residual():
    assert Variant.parse('IIII') == Variant('IIII', True)
    assert Variant.parse('LLLL-nores') == Variant('LLLL', False)
    assert Variant.parse('IIII-nores').name == 'IIII-nores'
    with pytest.raises(ValueError, match="optionally followed by '-nores'"):
        Variant.parse('IIII-x')


def test_summary_calls_only_apart_ranges_separated():
    runs = [Run('A', 0, 5, 10.0, 0.1, 1), Run('A', 1, 5, 12.0, 0.3, 1),
            Run('B', 0, 5, 11.0, 0.2, 1), Run('B', 1, 5, 11.5, 0.2, 1),
            Run('C', 0, 5, 20.0, 0.5, 1), Run('C', 1, 5, 21.0, 0.5, 1)]
    summary = summarise(runs)
    assert summary['A']['mean'] == 11.0 and math.isclose(summary['A']['std'], 2 ** 0.5)
    assert (summary['A']['min'], summary['A']['max'], summary['A']['seeds']) == (10, 12, 2)
    assert summary['A']['time_per_iter'] == pytest.approx(0.2)
    pairs = {(p['better'], p['worse']): p['separated'] for p in separations(summary)}
    assert pairs == {('C', 'B'): True, ('C', 'A'): True, ('B', 'A'): False}
    one_seed = summarise([Run('A', 0, 5, 1.0, 0.1, 1), Run('B', 0, 5, 2.0, 0.1, 1)])
    assert not any(p['separated'] for p in separations(one_seed))   # no spread: inconclusive


@pytest.mark.slow
def test_the_tool_trains_each_variant_and_seed(shapes, tmp_path):
    config = tmp_path / 'seg.py'
    config.write_text(seg_run_config(SEG_CONFIG, shapes))
    out = tmp_path / 'compare'
    results = compare_mixers.main([str(config), '--variants', 'SSSS', 'LLLL-nores',
                                   '--seeds', '0', '1', '--iters', '2', '--out-dir', str(out)])
    assert [(r['variant'], r['seed'], r['iters']) for r in results['runs']] == [
        ('SSSS', 0, 2), ('LLLL-nores', 0, 2), ('SSSS', 1, 2), ('LLLL-nores', 1, 2)]
    assert all(0 <= r['metric'] <= 100 and r['time_per_iter'] > 0 for r in results['runs'])
    assert json.loads((out / 'results.json').read_text())['summary'].keys() == {
        'SSSS', 'LLLL-nores'}
    assert 'beyond the seeds\' spread' in (out / 'results.md').read_text()
    # each run really built its variant (the config mmengine dumped into its work dir)
    for name, text in (('SSSS_seed1', "block_types='SSSS'"), ('LLLL-nores_seed0',
                                                                "local_residual=False")):
        dumped = glob.glob(osp.join(str(out), name, '*.py'))
        assert dumped and text in open(dumped[0]).read()
