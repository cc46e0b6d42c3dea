"""InLine attention against the authors' formulation, linear and softmax attention:
time (forward; forward+backward), minor page faults and peak extra memory per token map,
and the linearity pairs (time at 4x the tokens over time at 1x). The tool is
``tools/analysis_tools/benchmark_attention.py`` (:mod:`mmplugin_inline.cli.benchmark_attention`,
whose docstring says how it measures).
"""
import dataclasses
import json
import os
import statistics
from typing import List, Optional

import torch

from ..core import (
    inline_attention,
    inline_attention_authors,
    linear_attention,
    softmax_attention,
    softmax_attention_reference,
)
from .loglog import loglog_figure
from .measure import (
    huge_pages_in_use,
    interleaved_times,
    keep_freed_memory,
    minor_page_faults,
    parse_size,
    peak_extra_memory,
)

IMPLS = {
    'inline (ours)': inline_attention,
    'inline (authors)': inline_attention_authors,
    'linear': linear_attention,
    'softmax (SDPA)': softmax_attention,
    'softmax (naive)': softmax_attention_reference,
}
DEFAULT_MAPS = ['56x56', '64x64', '96x96', '128x128', '200x336', '256x256']


@dataclasses.dataclass
class AttentionBenchmarkOptions:
    """What :func:`run_benchmark` measures, and how (the options of
    ``tools/analysis_tools/benchmark_attention.py``, which takes its defaults from here).

    Args:
        maps (list[str]): ``'HxW'`` token maps.
        dims (list[int]): head widths d.
        heads (list[int]): head counts.
        batch (int): batch size.
        repeats (int): interleaved timed rounds per case (the linearity pairs: twice).
        softmax_limit_gb (float): skip naive softmax where its N x N tensors exceed this.
        softmax_max_tokens (int): skip softmax (quadratic time) above this many tokens.
        device (str): where to run; CUDA where available, else the CPU.
        out_dir (str): where ``benchmark_attention.{json,png,md}`` go.
        threads (int, optional): torch CPU threads; None keeps torch's choice.
        allocator (str): CPU: ``'keep'`` freed memory mapped
            (:func:`~mmplugin_inline.analysis.measure.keep_freed_memory`) or glibc's
            ``'default'`` behaviour.
    """
    maps: List[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_MAPS))
    dims: List[int] = dataclasses.field(default_factory=lambda: [32, 64])
    heads: List[int] = dataclasses.field(default_factory=lambda: [1, 2, 4])
    batch: int = 1
    repeats: int = 5
    softmax_limit_gb: float = 4.0
    softmax_max_tokens: int = 128 * 128
    device: str = dataclasses.field(
        default_factory=lambda: 'cuda' if torch.cuda.is_available() else 'cpu')
    out_dir: str = 'work_dirs/benchmark_attention'
    threads: Optional[int] = None
    allocator: str = 'keep'


def fits(name, n, heads, batch, limit_gb, softmax_max_tokens):
    """Whether to run an implementation: naive softmax only where its N x N
    intermediates fit in ``limit_gb``; both softmax kinds (O(N^2) time) only up to
    ``softmax_max_tokens`` tokens."""
    if name.startswith('softmax') and n > softmax_max_tokens:
        return False
    if name == 'softmax (naive)':
        return 3 * batch * heads * n * n * 4 / 2 ** 30 <= limit_gb  # scores, softmax, grad
    return True


def make_inputs(batch, heads, n, d, device, backward, seed=0):
    g = torch.Generator(device='cpu').manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=g).to(device).requires_grad_(backward)
            for _ in range(3)]


def run_once(fn, inputs, backward):
    out = fn(*inputs)
    if backward:
        out.backward(torch.ones_like(out))
        for t in inputs:
            t.grad = None
    return out


def peak_memory(fn, inputs, backward, device):
    """Peak bytes allocated during one call beyond what was allocated before it."""
    return peak_extra_memory(lambda: run_once(fn, inputs, backward), device)


def bench_case(impls, batch, heads, hw, d, device, repeats, backward):
    """Median time, minor page faults per call and peak extra memory of each
    implementation on one map: one warm-up round, then ``repeats`` interleaved rounds."""
    n = hw[0] * hw[1]
    inputs = make_inputs(batch, heads, n, d, device, backward)
    timed = interleaved_times(
        {name: (lambda fn=fn: run_once(fn, inputs, backward)) for name, fn in impls.items()},
        repeats, device, counter=minor_page_faults)
    times, faults = timed.times, timed.counts
    result = {}
    for name, fn in impls.items():
        result[name] = dict(time_ms=1e3 * statistics.median(times[name]),
                            page_faults=faults[name] / repeats,
                            peak_mb=peak_memory(fn, inputs, backward, device) / 2 ** 20)
    return result


def plot(results, path):
    """Time (forward; forward+backward) and peak memory against tokens, log-log, for the
    first head width and head count measured."""
    first = results[0]['d'], results[0]['heads']
    rows = [r for r in results if (r['d'], r['heads']) == first]
    panels = []
    for mode, key, title in (('forward', 'time_ms', 'forward time (ms)'),
                             ('forward+backward', 'time_ms', 'forward+backward time (ms)'),
                             ('forward+backward', 'peak_mb',
                              'peak extra memory, fwd+bwd (MiB)')):
        lines = []
        for name in IMPLS:
            pts = [(r['n'], r[mode][name][key]) for r in rows if name in r[mode]]
            if pts:
                lines.append((name, *zip(*pts), '-o'))
        panels.append(dict(lines=lines, xlabel='tokens N',
                           title=f'{title}\n(d={first[0]}, heads={first[1]}, batch 1)'))
    loglog_figure(panels, path, figsize=(16, 4.5), legend_first_only=True)


def ratio_table(results):
    lines = ['| map | N | d | heads | ours fwd ms | authors/ours fwd | authors/ours fwd+bwd | '
             'ours peak MiB | authors peak MiB | linear/ours fwd | SDPA/ours fwd |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in results:
        f, fb = r['forward'], r['forward+backward']
        ours_f, ours_fb = f['inline (ours)']['time_ms'], fb['inline (ours)']['time_ms']

        def ratio(mode, name):
            return f"{mode[name]['time_ms'] / (ours_f if mode is f else ours_fb):.2f}" \
                if name in mode else 'n/a'
        lines.append(
            f"| {r['map']} | {r['n']} | {r['d']} | {r['heads']} | {ours_f:.1f} | "
            f"{ratio(f, 'inline (authors)')} | {ratio(fb, 'inline (authors)')} | "
            f"{fb['inline (ours)']['peak_mb']:.1f} | {fb['inline (authors)']['peak_mb']:.1f} | "
            f"{ratio(f, 'linear')} | {ratio(f, 'softmax (SDPA)')} |")
    return '\n'.join(lines)


def tokens(name):
    """Token count of an 'HxW' map."""
    h, w = parse_size(name)
    return h * w


def linearity_pairs(maps):
    """(small, large) map names from ``maps`` where large has exactly 4x the tokens."""
    return [(a, b) for a in maps for b in maps if tokens(b) == 4 * tokens(a)]


def runnable(n, heads, options: AttentionBenchmarkOptions):
    """The implementations to time on ``n`` tokens (see :func:`fits`)."""
    return {k: v for k, v in IMPLS.items()
            if fits(k, n, heads, options.batch, options.softmax_limit_gb,
                    options.softmax_max_tokens)}


def per_mode(measure):
    """``{'forward': measure(False), 'forward+backward': measure(True)}``, each under
    the matching grad mode."""
    out = {}
    for mode, backward in (('forward', False), ('forward+backward', True)):
        with torch.enable_grad() if backward else torch.no_grad():
            out[mode] = measure(backward)
    return out


def linearity_case(impls, batch, heads, small_hw, large_hw, d, device, repeats, backward):
    """Median time at ``large_hw`` over median time at ``small_hw``, per implementation.

    The two sizes alternate (and implementations in turn), so a machine whose speed
    drifts over seconds affects both sides of the ratio alike; timing the sizes one
    after the other, as the grid does, does not. Each timed call follows an untimed
    call of the same implementation and size, so both sizes are timed with their own
    data as warm in the caches as it gets (not evicted by the other size).
    """
    inputs = {hw: make_inputs(batch, heads, hw[0] * hw[1], d, device, backward)
              for hw in (small_hw, large_hw)}
    calls = {(name, hw): (lambda fn=fn, x=x: run_once(fn, x, backward))
             for name, fn in impls.items() for hw, x in inputs.items()}
    times = interleaved_times(calls, repeats, device, rewarm=True).times
    return {name: statistics.median(times[(name, large_hw)]) /
            statistics.median(times[(name, small_hw)]) for name in impls}


def linearity_table(rows):
    """Rows of :func:`linearity_case` results as a table (linear time: 4.0)."""
    lines = ['| maps | d | heads | implementation | fwd ratio | fwd+bwd ratio |',
             '|---|---|---|---|---|---|']
    for row in rows:
        for name in row['forward']:
            lines.append(f"| {row['large']} / {row['small']} | {row['d']} | {row['heads']} | "
                         f"{name} | {row['forward'][name]:.2f} | "
                         f"{row['forward+backward'][name]:.2f} |")
    return '\n'.join(lines)


def run_benchmark(options: AttentionBenchmarkOptions) -> list:
    """The grid and the linearity pairs of ``options``; writes ``benchmark_attention.json``,
    ``.png`` and ``.md`` under ``options.out_dir``, prints the tables, returns the grid rows."""
    if options.threads:
        torch.set_num_threads(options.threads)
    allocator = 'default'
    if options.allocator == 'keep' and keep_freed_memory():
        allocator = 'keep (mallopt)'
    elif options.allocator == 'keep':
        print('note: could not tune the allocator (not glibc); measuring with its defaults')
    device = torch.device(options.device)
    huge_pages = device.type == 'cpu' and huge_pages_in_use()
    if device.type == 'cpu' and not huge_pages:
        print('note: 4 KiB pages (set THP_MEM_ALLOC_ENABLE=1 before starting for 2 MiB '
              'pages; large maps pay more TLB misses without them)')
    os.makedirs(options.out_dir, exist_ok=True)
    results = []
    for d in options.dims:
        for heads in options.heads:
            for m in options.maps:
                hw, n = parse_size(m), tokens(m)
                impls = runnable(n, heads, options)
                row = dict(map=m, n=n, d=d, heads=heads, batch=options.batch)
                row.update(per_mode(lambda backward: bench_case(
                    impls, options.batch, heads, hw, d, device, options.repeats, backward)))
                results.append(row)
                print(f"{m:>8} d={d} heads={heads}: " + ', '.join(
                    f"{k} {v['time_ms']:.1f}ms" for k, v in row['forward+backward'].items()),
                    flush=True)
    linearity = []
    for d in options.dims:
        for heads in options.heads:
            for small, large in linearity_pairs(options.maps):
                impls = runnable(tokens(large), heads, options)  # what fits the larger map
                row = dict(small=small, large=large, d=d, heads=heads)
                row.update(per_mode(lambda backward: linearity_case(
                    impls, options.batch, heads, parse_size(small), parse_size(large), d, device,
                    2 * options.repeats, backward)))
                linearity.append(row)
    meta = dict(device=str(device), torch=torch.__version__, threads=torch.get_num_threads(),
                allocator=allocator, huge_pages=huge_pages, repeats=options.repeats)
    with open(os.path.join(options.out_dir, 'benchmark_attention.json'), 'w') as f:
        json.dump(dict(meta=meta, results=results, linearity=linearity), f, indent=1)
    plot(results, os.path.join(options.out_dir, 'benchmark_attention.png'))
    table = ratio_table(results)
    linear = linearity_table(linearity)
    with open(os.path.join(options.out_dir, 'benchmark_attention.md'), 'w') as f:
        f.write(table + '\n\n' + linear + '\n')
    print(table)
    if len(linear.splitlines()) > 2:
        print(linear)
    print(f"written: {options.out_dir}/benchmark_attention.{{json,png,md}}")
    return results

