"""Race the InLine backbones against the softmax backbones users would pick instead.

The paper's Fig. 3 on your machine: for every family (T presets) our backbone and its
softmax peer run alternately in one process (interleaved repeats, medians), at a
resolution sweep, in inference (no grad) and as a training step (forward, a loss over
all outputs, backward). Peers:

- pvt:   mmdet's ``PyramidVisionTransformer`` with PVT-T settings (depths 2-2-2-2,
         heads 1-2-5-8, spatial reduction 8-4-2-1);
- swin:  mmdet's ``SwinTransformer``, Swin-T (window 7);
- cswin: CSWin-T's softmax form from our own blocks (``block_types='SSSS'``:
         cross-shaped stripe attention in every stage);
- deit:  timm's ``vit_tiny_patch16_224`` (DeiT-T: 192 wide, 12 blocks, 3 heads; SDPA),
         built without weights and with a dynamic image size.

The Swin window sweep (``--windows``, at ``--window-size-input``) compares InLine in
windows (``inline_window``) with softmax windows, both in every stage of InLine-Swin-T's
layout; a window larger than a stage's map is cut to the map, as the authors' Swin does.

Measured per model and case: median time, peak extra memory (torch's profiler on CPU,
the allocator on CUDA: ``mmplugin_inline.analysis.peak_extra_memory``), forward FLOPs
from our counter (``mmplugin_inline.analysis.flop_analyzer``; multiply-accumulates, the
papers' convention; a training step is counted as 3x the forward), and the achieved
rate against a large fp32 matrix product (``--gemm-size``) timed in the same rounds:
how close to the hardware the model runs. A model whose previous size predicts a call
over ``--max-call-s`` or peak memory over ``--max-memory-gb`` is skipped at larger sizes,
with the reason in the table.

Writes ``results.json``, ``results.md`` and ``time_vs_pixels.png`` / ``memory_vs_pixels.png``
(log-log; the fitted slope of time against pixels is in the legend and the table) under
``--out-dir``. ``--with-cp none mlp attn full`` adds our backbones with those
``with_cp`` settings to the training-step races (the memory / time trade-off).

    python tools/analysis_tools/benchmark_backbones.py --out-dir work_dirs/bench_backbones
    python tools/analysis_tools/benchmark_backbones.py --families pvt --sizes 224x224 \\
        --repeats 1 --modes infer --device cuda          # one quick case
"""
import argparse
import json
import math
import os
import platform
import statistics

import torch

FAMILIES = ('pvt', 'swin', 'cswin', 'deit')
MODES = ('infer', 'train')
DEFAULT_SIZES = ('224x224', '512x512', '800x1344', '1024x2048')
CP_VALUES = {'none': False, 'full': True, 'mlp': 'mlp', 'attn': 'attn'}
OURS = {'pvt': 'InLine-PVT-T', 'swin': 'InLine-Swin-T', 'cswin': 'InLine-CSWin-T',
        'deit': 'InLine-DeiT-T'}
PEERS = {'pvt': 'PVT-T (mmdet)', 'swin': 'Swin-T w7 (mmdet)', 'cswin': 'CSWin-T softmax',
         'deit': 'DeiT-T (timm)'}


def parse_size(text):
    try:
        h, w = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'sizes are HxW, e.g. 800x1344; got {text!r}')
    return h, w


class Tokens(torch.nn.Module):
    """A timm ViT's patch tokens (``forward_features``) as a one-element tuple."""

    def __init__(self, vit):
        super().__init__()
        self.vit = vit

    def forward(self, x):
        return (self.vit.forward_features(x),)


def build_ours(family, with_cp=False, **kw):
    import mmplugin_inline  # noqa: F401  (registers the backbones)
    from mmplugin_inline.registry import MODELS
    types = {'pvt': 'InLinePVT', 'swin': 'InLineSwinTransformer',
             'cswin': 'InLineCSWinTransformer', 'deit': 'InLineDeiT'}
    cfg = dict(type=types[family], arch='t', drop_path_rate=0.1, with_cp=with_cp)
    if family == 'deit':
        cfg['out_indices'] = (3, 5, 7, 11)
    cfg.update(kw)
    return MODELS.build(cfg)


def build_peer(family):
    if family == 'pvt':
        from mmdet.models.backbones import PyramidVisionTransformer
        return PyramidVisionTransformer(num_layers=[2, 2, 2, 2], drop_path_rate=0.1)
    if family == 'swin':
        from mmdet.models.backbones import SwinTransformer
        return SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
                               window_size=7, drop_path_rate=0.1)
    if family == 'cswin':
        return build_ours('cswin', block_types='SSSS')
    import timm
    return Tokens(timm.create_model('vit_tiny_patch16_224', pretrained=False, num_classes=0,
                                    dynamic_img_size=True, drop_path_rate=0.1))


def clamp_windows(model, input_hw):
    """Cut windows larger than a stage's (square) map to the map, as the authors' Swin does
    (``window_size = min(input_resolution)``, no shift); the bias table is indexed for the
    smaller window."""
    from mmplugin_inline.models.layers import WindowAttention, relative_position_index
    side = min(input_hw) // 4
    for layer in model.layers:
        for blk in layer.blocks:
            attn = blk.attn
            if isinstance(attn, WindowAttention) and attn.window_size > side:
                table = attn.window_size
                attn.window_size = side
                if attn.use_rel_pos:
                    attn.relative_position_index = relative_position_index(
                        (side, side), (table, table)).to(attn.relative_position_index.device)
        side = -(-side // 2)
    return model


def window_models(window, input_hw):
    inline = build_ours('swin', block_types='IIII', inline_window=window)
    softmax = build_ours('swin', block_types='SSSS', window_size=window)
    return {f'InLine windows {window}': clamp_windows(inline, input_hw),
            f'softmax windows {window}': clamp_windows(softmax, input_hw)}


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def make_call(model, x, mode, reference=False):
    """One inference or training-step call; ``reference``: on the package's reference
    paths (``mmplugin_inline.core.reference_paths``), the code the fast paths replaced."""
    from mmplugin_inline.core import reference_paths
    if mode == 'infer':
        def step():
            with torch.no_grad():
                return model(x)
    else:
        def step():
            loss = sum(o.float().mean() for o in as_tuple(model(x)))
            loss.backward()
            for p in model.parameters():
                p.grad = None

    def call():
        with reference_paths(reference):
            return step()
    return call


def gemm_call(size, device):
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    return lambda: torch.mm(a, b)


def forward_flops(model, x):
    from mmplugin_inline.analysis import flop_analyzer
    model.eval()
    with torch.no_grad():
        return flop_analyzer(model, (x,)).total()


def predicted_over(history, pixels, max_s, max_mb):
    """A reason to skip from the last measured sizes of a model (log-log extrapolation),
    or None."""
    from mmplugin_inline.analysis.measure import extrapolate
    done = [h for h in history if h.get('time_ms') is not None]
    seconds = extrapolate([(h['pixels'], h['time_ms'] / 1e3) for h in done], pixels)
    if seconds is None:
        return None
    if seconds > max_s:
        return f'skipped: predicted {seconds:.0f} s a call > --max-call-s'
    last = done[-1]
    grow = seconds / (last['time_ms'] / 1e3)  # memory grows as the time does
    if last.get('peak_mb') and last['peak_mb'] * grow > max_mb:
        return f'skipped: predicted {last["peak_mb"] * grow / 1024:.1f} GiB > --max-memory-gb'
    return None


def race(models, hw, mode, args, gemm, history, flops_cache, tag):
    """Measure ``models`` ({name: (model, meta)}) at one size and mode, interleaved."""
    from mmplugin_inline.analysis.measure import interleaved_times, peak_extra_memory
    device, pixels = args.device, hw[0] * hw[1]
    x = torch.randn(1, 3, *hw, device=device)
    rows, calls = {}, {}
    for name, (model, meta) in models.items():
        row = dict(meta, model=name, size=f'{hw[0]}x{hw[1]}', pixels=pixels, mode=mode,
                   case=tag, time_ms=None, peak_mb=None, gflops=None)
        rows[name] = row
        reason = predicted_over(history.setdefault((tag, name, mode), []), pixels,
                                args.max_call_s, args.max_memory_gb * 1024)
        if reason:
            row['note'] = reason
            continue
        if not args.no_flops:
            key = (name, hw)
            if key not in flops_cache:
                flops_cache[key] = forward_flops(model, x)
            row['gflops'] = flops_cache[key] / 1e9 * (3 if mode == 'train' else 1)
        model.train(mode == 'train')
        calls[name] = make_call(model, x, mode, meta.get('reference_paths', False))
    timed = interleaved_times(calls, args.repeats, device, reference=gemm,
                              max_warmup_s=args.max_call_s)
    for name in timed.over_cap:
        rows[name]['note'] = 'one timed call (the warm-up exceeded --max-call-s)'
    times, gemm_times = timed.times, timed.reference
    gemm_rate = args.gemm_size ** 3 / statistics.median(gemm_times) / 1e9 if gemm_times else None
    for name, ts in times.items():
        row = rows[name]
        row['times_ms'] = [1e3 * t for t in ts]
        row['time_ms'] = 1e3 * statistics.median(ts)
        if not args.no_memory:
            model, meta = models[name]
            row['peak_mb'] = peak_extra_memory(
                make_call(model, x, mode, meta.get('reference_paths', False)), device) / 2 ** 20
        if row['gflops'] is not None:
            row['gflop_per_s'] = row['gflops'] / (row['time_ms'] / 1e3)
            if gemm_rate:
                row['of_gemm'] = row['gflop_per_s'] / gemm_rate
        row['gemm_gflop_per_s'] = gemm_rate
        history[(tag, name, mode)].append(row)
    return list(rows.values())


def fitted_slope(rows):
    """Least-squares slope of log time against log pixels (None with < 2 sizes)."""
    pts = [(math.log(r['pixels']), math.log(r['time_ms'])) for r in rows
           if r.get('time_ms') is not None]
    if len({p for p, _ in pts}) < 2:
        return None
    mx = sum(p for p, _ in pts) / len(pts)
    my = sum(t for _, t in pts) / len(pts)
    return sum((p - mx) * (t - my) for p, t in pts) / sum((p - mx) ** 2 for p, _ in pts)


def series(results, case='sizes'):
    """{(mode, model): [rows by pixels]} of one case."""
    out = {}
    for r in results:
        if r['case'] == case:
            out.setdefault((r['mode'], r['model']), []).append(r)
    return out


def fmt(value, spec):
    return '-' if value is None else format(value, spec)


def markdown(results, env):
    lines = [f"Device: {env['device']} ({env['threads']} threads), torch {env['torch']}, "
             f"{env['repeats']} interleaved repeats (medians); load average "
             f"{env['load_start']} at the start, {env['load_end']} at the end; fp32 GEMM "
             f"{env['gemm_size']}^3: {fmt(env.get('gemm_gflop_per_s'), '.1f')} GFLOP/s "
             '(multiply-accumulates per second, the FLOP counter\'s convention).', '']
    by_case = {}
    for r in results:
        if r['case'] == 'sizes':
            by_case.setdefault((r['family'], r['size'], r['mode']), []).append(r)
    lines += ['| family | size | mode | ours ms | peer ms | speed-up (peer / ours) | '
              'FLOPs ratio (peer / ours) | ours GFLOP/s (% of GEMM) | peer GFLOP/s '
              '(% of GEMM) | ours / peer peak MiB |', '|' + '---|' * 10]
    for (family, size, mode), rows in by_case.items():
        ours = next((r for r in rows if r['role'] == 'ours' and
                     r.get('with_cp') in (None, 'none') and not r.get('reference_paths')),
                    None)
        peer = next((r for r in rows if r['role'] == 'peer'), None)
        if ours is None or peer is None:
            continue

        def rate(r):
            if r.get('gflop_per_s') is None:
                return r.get('note', '-')
            share = f" ({100 * r['of_gemm']:.0f}%)" if r.get('of_gemm') else ''
            return f"{r['gflop_per_s']:.1f}{share}"
        speed = peer['time_ms'] / ours['time_ms'] if ours['time_ms'] and peer['time_ms'] \
            else None
        flops = peer['gflops'] / ours['gflops'] if ours['gflops'] and peer['gflops'] else None
        lines.append(
            f"| {family} | {size} | {mode} | {fmt(ours['time_ms'], '.1f')} | "
            f"{fmt(peer['time_ms'], '.1f') if peer['time_ms'] else peer.get('note', '-')} | "
            f"{fmt(speed, '.2f')}x | {fmt(flops, '.2f')} | {rate(ours)} | {rate(peer)} | "
            f"{fmt(ours['peak_mb'], ',.0f')} / {fmt(peer['peak_mb'], ',.0f')} |")
    refs = [r for r in results if r.get('reference_paths') and r['case'] == 'sizes']
    if refs:
        lines += ['', '| family | size | mode | reference paths ms | fast paths ms | '
                  'speed-up (reference / fast) | reference / fast peak MiB |',
                  '|---|---|---|---|---|---|---|']
        for ref in refs:
            fast = next((r for r in by_case[(ref['family'], ref['size'], ref['mode'])]
                         if r['role'] == 'ours' and not r.get('reference_paths') and
                         r.get('with_cp') in (None, 'none')), None)
            if fast is None:
                continue
            speed = ref['time_ms'] / fast['time_ms'] if ref['time_ms'] and fast['time_ms'] \
                else None
            lines.append(f"| {ref['family']} | {ref['size']} | {ref['mode']} | "
                         f"{fmt(ref['time_ms'], '.1f')} | {fmt(fast['time_ms'], '.1f')} | "
                         f"{fmt(speed, '.2f')}x | {fmt(ref['peak_mb'], ',.0f')} / "
                         f"{fmt(fast['peak_mb'], ',.0f')} |")
    slopes = [(m, model, fitted_slope(rows)) for (m, model), rows in series(results).items()]
    slopes = [s for s in slopes if s[2] is not None]
    if slopes:
        lines += ['', '| model | mode | fitted slope of time vs pixels (log-log; 1 = linear) |',
                  '|---|---|---|']
        lines += [f'| {model} | {m} | {s:.2f} |' for m, model, s in slopes]
    cp_rows = [r for r in results if r.get('with_cp') is not None and r['mode'] == 'train']
    if cp_rows:
        lines += ['', '| model | size | with_cp | step ms | time / none | peak MiB | '
                  'peak / none |', '|---|---|---|---|---|---|---|']
        for r in cp_rows:
            base = next((b for b in cp_rows if b['family'] == r['family'] and
                         b['size'] == r['size'] and b['with_cp'] == 'none'), None)
            t_ratio = r['time_ms'] / base['time_ms'] if base and r['time_ms'] and \
                base['time_ms'] else None
            m_ratio = r['peak_mb'] / base['peak_mb'] if base and r['peak_mb'] and \
                base['peak_mb'] else None
            lines.append(f"| {OURS[r['family']]} | {r['size']} | {r['with_cp']} | "
                         f"{fmt(r['time_ms'], '.0f')} | {fmt(t_ratio, '.2f')} | "
                         f"{fmt(r['peak_mb'], ',.0f')} | {fmt(m_ratio, '.2f')} |")
    win = [r for r in results if r['case'] == 'windows']
    if win:
        lines += ['', '| window | mode | InLine in windows ms | softmax windows ms | '
                  'softmax / InLine | FLOPs ratio |', '|---|---|---|---|---|---|']
        for w in sorted({r['window'] for r in win}):
            for mode in MODES:
                pair = {r['attention']: r for r in win if r['window'] == w and
                        r['mode'] == mode}
                if len(pair) < 2:
                    continue
                i, s = pair['inline'], pair['softmax']
                speed = s['time_ms'] / i['time_ms'] if i['time_ms'] and s['time_ms'] else None
                flops = s['gflops'] / i['gflops'] if i['gflops'] and s['gflops'] else None
                lines.append(f"| {w} | {mode} | {fmt(i['time_ms'], '.1f')} | "
                             f"{fmt(s['time_ms'], '.1f')} | {fmt(speed, '.2f')}x | "
                             f"{fmt(flops, '.2f')} |")
    return '\n'.join(lines) + '\n'


def plot(results, out_dir):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    groups = series(results)
    paths = []
    for key, ylabel, fname in (('time_ms', 'time (ms)', 'time_vs_pixels.png'),
                               ('peak_mb', 'peak extra memory (MiB)', 'memory_vs_pixels.png')):
        modes = [m for m in MODES if any(r['mode'] == m and r.get(key) is not None
                                         for r in results if r['case'] == 'sizes')]
        if not modes:
            continue
        fig, axes = plt.subplots(1, len(modes), figsize=(7 * len(modes), 5), squeeze=False)
        for ax, mode in zip(axes[0], modes):
            for (m, model), rows in sorted(groups.items()):
                rows = [r for r in rows if r.get(key) is not None]
                if m != mode or not rows:
                    continue
                label = model
                if key == 'time_ms':
                    slope = fitted_slope(rows)
                    label += f' (slope {slope:.2f})' if slope is not None else ''
                ours = rows[0]['role'] == 'ours'
                ax.loglog([r['pixels'] for r in rows], [r[key] for r in rows],
                          '-o' if ours else '--s', label=label)
            ax.set_xlabel('input pixels')
            ax.set_ylabel(ylabel)
            ax.set_title(f'{mode} ({"forward, no grad" if mode == "infer" else "fwd + bwd"})')
            ax.grid(True, which='both', alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--families', nargs='*', choices=FAMILIES, default=list(FAMILIES),
                        help='families to race (none: only the window sweep)')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[parse_size(s) for s in DEFAULT_SIZES], help='HxW inputs')
    parser.add_argument('--modes', nargs='+', choices=MODES, default=list(MODES))
    parser.add_argument('--with-cp', nargs='+', choices=sorted(CP_VALUES), default=[],
                        help="also race our backbones with these with_cp settings in "
                             "training steps ('none' False, 'full' True)")
    parser.add_argument('--reference-paths', action='store_true',
                        help='also race our backbones on the reference paths (the code the '
                             'fast paths replaced; mmplugin_inline.core.reference_paths), '
                             'same weights, in the same rounds')
    parser.add_argument('--windows', nargs='*', type=int, default=[],
                        help="Swin window sweep, e.g. 7 14 28 56 (none by default)")
    parser.add_argument('--window-size-input', type=parse_size, default=(224, 224))
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--threads', type=int, default=None, help='CPU threads (torch)')
    parser.add_argument('--gemm-size', type=int, default=2048)
    parser.add_argument('--max-call-s', type=float, default=60.0)
    parser.add_argument('--max-memory-gb', type=float, default=16.0)
    parser.add_argument('--no-memory', action='store_true', help='skip peak memory')
    parser.add_argument('--no-flops', action='store_true', help='skip FLOP counts')
    parser.add_argument('--no-plots', action='store_true')
    parser.add_argument('--out-dir', default='work_dirs/benchmark_backbones')
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error('--repeats must be at least 1')
    return args


def main(argv=None):
    from mmplugin_inline.analysis import measure
    args = parse_args(argv)
    if torch.device(args.device).type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit(f'--device {args.device} asked for, but CUDA is not available here')
    if args.threads:
        torch.set_num_threads(args.threads)
    if torch.device(args.device).type == 'cpu':
        measure.keep_freed_memory()
    os.makedirs(args.out_dir, exist_ok=True)
    env = dict(device=str(args.device), threads=torch.get_num_threads(),
               torch=torch.__version__, machine=platform.processor() or platform.machine(),
               repeats=args.repeats, gemm_size=args.gemm_size, load_start=measure.load_average())
    gemm = gemm_call(args.gemm_size, args.device)
    results, history, flops_cache = [], {}, {}

    def save_partial():  # a long run interrupted keeps what it measured
        with open(os.path.join(args.out_dir, 'results.json'), 'w') as f:
            json.dump(dict(env=env, partial=True, results=results), f, indent=1, default=str)
    cp_modes = [m for m in args.with_cp if m != 'none'] if 'train' in args.modes else []
    for family in args.families:
        base = {OURS[family]: (build_ours(family), dict(family=family, role='ours')),
                PEERS[family]: (build_peer(family), dict(family=family, role='peer'))}
        variants = {}
        if args.reference_paths:
            base[f'{OURS[family]} (reference paths)'] = (
                base[OURS[family]][0], dict(family=family, role='ours', reference_paths=True))
        if args.with_cp:
            base[OURS[family]][1]['with_cp'] = 'none'
            variants = {f'{OURS[family]} with_cp={m}': (
                build_ours(family, with_cp=CP_VALUES[m]),
                dict(family=family, role='ours', with_cp=m)) for m in cp_modes}
            for model, _ in variants.values():
                model.load_state_dict(base[OURS[family]][0].state_dict())
        for model, _ in list(base.values()) + list(variants.values()):
            model.to(args.device)
        for hw in args.sizes:
            for mode in args.modes:
                models = dict(base, **(variants if mode == 'train' else {}))
                rows = race(models, hw, mode, args, gemm, history, flops_cache, 'sizes')
                results += rows
                save_partial()
                for r in rows:
                    print(f"{r['model']:32s} {r['size']:>10s} {mode:5s} "
                          f"{fmt(r['time_ms'], '10.1f')} ms  {fmt(r['peak_mb'], '8.0f')} MiB  "
                          f"{r.get('note', '')}", flush=True)
    for window in args.windows:
        models = {name: (model.to(args.device),
                         dict(family='swin', window=window,
                              attention='inline' if name.startswith('InLine') else 'softmax',
                              role='ours' if name.startswith('InLine') else 'peer'))
                  for name, model in window_models(window, args.window_size_input).items()}
        for mode in args.modes:
            rows = race(models, args.window_size_input, mode, args, gemm, history, flops_cache,
                        'windows')
            results += rows
            save_partial()
            for r in rows:
                print(f"{r['model']:32s} {r['size']:>10s} {mode:5s} "
                      f"{fmt(r['time_ms'], '10.1f')} ms", flush=True)
    env['load_end'] = measure.load_average()
    rates = [r['gemm_gflop_per_s'] for r in results if r.get('gemm_gflop_per_s')]
    env['gemm_gflop_per_s'] = statistics.median(rates) if rates else None
    table = markdown(results, env)
    with open(os.path.join(args.out_dir, 'results.json'), 'w') as f:
        json.dump(dict(env=env, args={k: v for k, v in vars(args).items()},
                       results=results), f, indent=1, default=str)
    with open(os.path.join(args.out_dir, 'results.md'), 'w') as f:
        f.write(table)
    plots = [] if args.no_plots else plot(results, args.out_dir)
    print(table)
    print('wrote', ', '.join([os.path.join(args.out_dir, n) for n in ('results.json',
                                                                       'results.md')] + plots))
    return dict(env=env, results=results, plots=plots)


if __name__ == '__main__':
    main()
