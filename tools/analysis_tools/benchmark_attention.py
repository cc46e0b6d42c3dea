"""Benchmark InLine attention against the authors' formulation, linear and softmax attention.

For each token count N (a H x W map), head width d and head count, measures forward and
forward+backward time (median of interleaved repeats: the implementations alternate
inside one run so that a noisy machine affects them alike) and peak extra memory
(allocator peak over the inputs, from torch's profiler on CPU or the CUDA allocator).
Writes a JSON file and a log-log PNG plot, and prints a table of ratios to our kernel
and a linearity table: time at 4x the tokens over time at 1x (e.g. 256x256 / 128x128;
linear is 4), for every such pair of maps given, measured apart from the grid with the
two sizes alternating call by call (2x the repeats).

On CPU, glibc's malloc by default hands large blocks back to the system when they are
freed, so every call pays page faults to get zeroed pages again; that cost grows faster
than the tensors and is not the kernels'. ``--allocator keep`` (the default) keeps
freed memory mapped (see ``mmplugin_inline.analysis.keep_freed_memory``);
``--allocator default`` measures with glibc's defaults. Minor page faults per call are
recorded either way. With 4 KiB pages, large maps also pay TLB misses that small ones
do not; ``THP_MEM_ALLOC_ENABLE=1`` in the environment (torch reads it at start-up) puts
torch's large blocks on 2 MiB pages. Whether that took effect is recorded too.

    THP_MEM_ALLOC_ENABLE=1 python tools/analysis_tools/benchmark_attention.py \
        --out-dir work_dirs/bench_attn
    python tools/analysis_tools/benchmark_attention.py --quick   # a small smoke run
"""
import argparse
import json
import os
import statistics
import time

import torch

from mmplugin_inline.analysis.measure import (huge_pages_in_use, keep_freed_memory,
                                              minor_page_faults, peak_extra_memory,
                                              synchronize)
from mmplugin_inline.core import (inline_attention, inline_attention_authors, linear_attention,
                                  softmax_attention, softmax_attention_reference)

IMPLS = {
    'inline (ours)': inline_attention,
    'inline (authors)': inline_attention_authors,
    'linear': linear_attention,
    'softmax (SDPA)': softmax_attention,
    'softmax (naive)': softmax_attention_reference,
}
DEFAULT_MAPS = ['56x56', '64x64', '96x96', '128x128', '200x336', '256x256']


def parse_map(text):
    h, w = text.lower().split('x')
    return int(h), int(w)


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
    n = hw[0] * hw[1]
    inputs = make_inputs(batch, heads, n, d, device, backward)
    times = {name: [] for name in impls}
    faults = dict.fromkeys(impls, 0)
    for name, fn in impls.items():  # warm-up
        run_once(fn, inputs, backward)
    for _ in range(repeats):
        for name, fn in impls.items():  # interleaved
            synchronize(device)
            before = minor_page_faults()
            start = time.perf_counter()
            run_once(fn, inputs, backward)
            synchronize(device)
            times[name].append(time.perf_counter() - start)
            faults[name] += minor_page_faults() - before
    result = {}
    for name, fn in impls.items():
        result[name] = dict(time_ms=1e3 * statistics.median(times[name]),
                            page_faults=faults[name] / repeats,
                            peak_mb=peak_memory(fn, inputs, backward, device) / 2 ** 20)
    return result


def plot(results, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    panels = [('forward', 'time_ms', 'forward time (ms)'),
              ('forward+backward', 'time_ms', 'forward+backward time (ms)'),
              ('forward+backward', 'peak_mb', 'peak extra memory, fwd+bwd (MiB)')]
    first = results[0]['d'], results[0]['heads']
    rows = [r for r in results if (r['d'], r['heads']) == first]
    for ax, (mode, key, title) in zip(axes, panels):
        for name in IMPLS:
            pts = [(r['n'], r[mode][name][key]) for r in rows if name in r[mode]]
            if pts:
                ax.plot(*zip(*pts), marker='o', label=name)
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('tokens N')
        ax.set_title(f'{title}\n(d={first[0]}, heads={first[1]}, batch 1)')
        ax.grid(True, which='both', alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    h, w = parse_map(name)
    return h * w


def linearity_pairs(maps):
    """(small, large) map names from ``maps`` where large has exactly 4x the tokens."""
    return [(a, b) for a in maps for b in maps if tokens(b) == 4 * tokens(a)]


def runnable(n, heads, args):
    """The implementations to time on ``n`` tokens (see :func:`fits`)."""
    return {k: v for k, v in IMPLS.items()
            if fits(k, n, heads, args.batch, args.softmax_limit_gb, args.softmax_max_tokens)}


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
    times = {(name, hw): [] for name in impls for hw in inputs}
    for name, fn in impls.items():  # warm-up
        for hw in inputs:
            run_once(fn, inputs[hw], backward)
    for _ in range(repeats):
        for name, fn in impls.items():
            for hw in inputs:
                run_once(fn, inputs[hw], backward)  # the same call again, untimed: warm
                synchronize(device)
                start = time.perf_counter()
                run_once(fn, inputs[hw], backward)
                synchronize(device)
                times[(name, hw)].append(time.perf_counter() - start)
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--maps', nargs='+', default=DEFAULT_MAPS, help='H x W token maps')
    parser.add_argument('--dims', type=int, nargs='+', default=[32, 64])
    parser.add_argument('--heads', type=int, nargs='+', default=[1, 2, 4])
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--softmax-limit-gb', type=float, default=4.0,
                        help='skip naive softmax where its N x N tensors exceed this')
    parser.add_argument('--softmax-max-tokens', type=int, default=128 * 128,
                        help='skip softmax (quadratic time) above this many tokens')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out-dir', default='work_dirs/benchmark_attention')
    parser.add_argument('--threads', type=int, default=None,
                        help='torch CPU threads (default: torch\'s choice); 1 is steadier on '
                             'a busy machine')
    parser.add_argument('--allocator', choices=['keep', 'default'], default='keep',
                        help="CPU: 'keep' freed memory mapped (no page faults from glibc "
                             "returning it), or glibc's 'default' behaviour")
    parser.add_argument('--quick', action='store_true', help='tiny sizes, one repeat')
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    allocator = 'default'
    if args.allocator == 'keep' and keep_freed_memory():
        allocator = 'keep (mallopt)'
    elif args.allocator == 'keep':
        print('note: could not tune the allocator (not glibc); measuring with its defaults')
    device = torch.device(args.device)
    huge_pages = device.type == 'cpu' and huge_pages_in_use()
    if device.type == 'cpu' and not huge_pages:
        print('note: 4 KiB pages (set THP_MEM_ALLOC_ENABLE=1 before starting for 2 MiB '
              'pages; large maps pay more TLB misses without them)')
    if args.quick:
        args.maps, args.dims, args.heads, args.repeats = ['16x16', '32x32'], [8], [2], 1
    os.makedirs(args.out_dir, exist_ok=True)
    results = []
    for d in args.dims:
        for heads in args.heads:
            for m in args.maps:
                hw, n = parse_map(m), tokens(m)
                impls = runnable(n, heads, args)
                row = dict(map=m, n=n, d=d, heads=heads, batch=args.batch)
                row.update(per_mode(lambda backward: bench_case(
                    impls, args.batch, heads, hw, d, device, args.repeats, backward)))
                results.append(row)
                print(f"{m:>8} d={d} heads={heads}: " + ', '.join(
                    f"{k} {v['time_ms']:.1f}ms" for k, v in row['forward+backward'].items()),
                    flush=True)
    linearity = []
    for d in args.dims:
        for heads in args.heads:
            for small, large in linearity_pairs(args.maps):
                impls = runnable(tokens(large), heads, args)  # what fits the larger map
                row = dict(small=small, large=large, d=d, heads=heads)
                row.update(per_mode(lambda backward: linearity_case(
                    impls, args.batch, heads, parse_map(small), parse_map(large), d, device,
                    2 * args.repeats, backward)))
                linearity.append(row)
    meta = dict(device=str(device), torch=torch.__version__, threads=torch.get_num_threads(),
                allocator=allocator, huge_pages=huge_pages, repeats=args.repeats)
    with open(os.path.join(args.out_dir, 'benchmark_attention.json'), 'w') as f:
        json.dump(dict(meta=meta, results=results, linearity=linearity), f, indent=1)
    plot(results, os.path.join(args.out_dir, 'benchmark_attention.png'))
    table = ratio_table(results)
    linear = linearity_table(linearity)
    with open(os.path.join(args.out_dir, 'benchmark_attention.md'), 'w') as f:
        f.write(table + '\n\n' + linear + '\n')
    print(table)
    if len(linear.splitlines()) > 2:
        print(linear)
    print(f"written: {args.out_dir}/benchmark_attention.{{json,png,md}}")
    return results


if __name__ == '__main__':
    main()
