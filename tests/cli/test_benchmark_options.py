"""The benchmarks' command lines become their typed options: every option of a tool is a
field of its analysis dataclass and the other way round, with the same defaults, and a
Python caller gets the race without a command line."""
import dataclasses
import json

import pytest

from mmplugin_inline.analysis.attention_benchmark import AttentionBenchmarkOptions
from mmplugin_inline.analysis.attention_benchmark import run_benchmark as run_attention
from mmplugin_inline.analysis.backbone_benchmark import BackboneRaceOptions
from mmplugin_inline.analysis.model_race import ModelRaceOptions
from mmplugin_inline.cli import benchmark_attention, benchmark_backbones, benchmark_models


@pytest.mark.parametrize('tool, options', [
    (benchmark_backbones, BackboneRaceOptions),
    (benchmark_models, ModelRaceOptions),
])
def test_every_option_is_a_field_with_its_default(tool, options):
    args = vars(tool.parse_args([]))
    assert set(args) == {f.name for f in dataclasses.fields(options)}
    assert options(**args) == options()


def test_attention_quick_replaces_the_grid_and_keeps_the_rest():
    plain = benchmark_attention.benchmark_options(benchmark_attention.parse_args([]))
    assert plain == AttentionBenchmarkOptions()
    quick = benchmark_attention.benchmark_options(benchmark_attention.parse_args(
        ['--quick', '--batch', '3', '--maps', '64x64']))
    assert (quick.maps, quick.dims, quick.heads, quick.repeats) == (['16x16', '32x32'], [8],
                                                                    [2], 1)
    assert quick.batch == 3 and quick.allocator == 'keep'


def test_attention_benchmark_runs_from_python(tmp_path):
    rows = run_attention(AttentionBenchmarkOptions(
        maps=['8x8'], dims=[4], heads=[1], repeats=1, device='cpu', out_dir=str(tmp_path),
        allocator='default'))
    assert [(r['map'], r['d'], r['heads']) for r in rows] == [('8x8', 4, 1)]
    saved = json.loads((tmp_path / 'benchmark_attention.json').read_text())
    assert saved['meta']['allocator'] == 'default' and len(saved['results']) == 1
