"""mmplugin_inline.analysis.model_benchmark (tools/analysis_tools/benchmark.py): images/s and
peak memory, mmdet and mmseg, CPU."""
import pytest
import torch

from helpers.tool_configs import tiny_mask_rcnn, tiny_sem_fpn
from mmplugin_inline.analysis import model_benchmark, peak_extra_memory, time_calls
from mmplugin_inline.cli import benchmark as benchmark_tool


def test_time_calls_warms_up_then_times_each_call():
    calls = []
    times = time_calls(lambda: calls.append(1), warmup=3, iters=2)
    assert len(calls) == 5 and len(times) == 2 and all(t >= 0 for t in times)


def test_peak_extra_memory_sees_the_largest_live_set_not_the_sum():
    def two_buffers_one_after_the_other():
        a = torch.ones(1 << 20)        # 4 MiB, freed before b exists
        del a
        b = torch.ones(1 << 21)        # 8 MiB
        return b.sum()
    peak = peak_extra_memory(two_buffers_one_after_the_other)
    assert 8 * 2 ** 20 <= peak < 12 * 2 ** 20


@pytest.mark.parametrize('make_config, codebase, growth', [(tiny_mask_rcnn, 'mmdet', 1.1),
                                                           (tiny_sem_fpn, 'mmseg', 1.8)])
def test_benchmark_runs_and_memory_grows_with_batch(tmp_path, make_config, codebase, growth):
    # the random weights decide how many detections survive, and so the memory: seeded,
    # so that the test does not depend on what ran before it (one seed gave 1.05x)
    torch.manual_seed(0)
    config = make_config(tmp_path)
    one = model_benchmark.benchmark(config, (97, 131), batch=1, warmup=1, iters=2)
    assert one['codebase'] == codebase and one['mode'] == 'predict' and len(one['times']) == 2
    assert one['images_per_s'] > 0 and one['peak_extra_mb'] > 0 and one['weights_mb'] > 0
    two = model_benchmark.benchmark(config, (97, 131), batch=2, warmup=0, iters=1)
    assert two['batch'] == 2
    # two images need more memory than one (segmentation: twice the logits; detection:
    # the per-image part grows, the proposal / RoI part much less): a batch of one
    # measured twice would give the same figure
    assert two['peak_extra_mb'] > growth * one['peak_extra_mb']
    tensor = model_benchmark.benchmark(config, (97, 131), warmup=0, iters=1, mode='tensor')
    assert tensor['mode'] == 'tensor' and tensor['images_per_s'] > 0


def test_cli_prints_throughput_memory_and_padded_shape(tmp_path, capsys):
    result = benchmark_tool.main([tiny_mask_rcnn(tmp_path), '--shape', '97', '131', '--warmup', '0',
                             '--iters', '1'])
    out = capsys.readouterr().out
    assert result['input_shape'] == (3, 128, 160)      # mmdet pads to a multiple of 32
    assert 'images/s' in out and 'Peak memory' in out and 'padded' in out and '128 x 160' in out
    with pytest.raises(SystemExit):
        benchmark_tool.main([str(tmp_path / 'missing.py')])
