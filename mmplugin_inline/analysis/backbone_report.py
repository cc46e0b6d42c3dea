"""The backbone race's report (:mod:`mmplugin_inline.analysis.backbone_benchmark`): the
markdown tables and the log-log plots of time and memory against input pixels."""
import os

from .loglog import fitted_slope, loglog_figure

MODES = ('infer', 'train')
OURS = {'pvt': 'InLine-PVT-T', 'swin': 'InLine-Swin-T', 'cswin': 'InLine-CSWin-T',
        'deit': 'InLine-DeiT-T'}


def time_slope(rows):
    """Fitted slope of log time against log pixels over rows (None with < 2 sizes)."""
    return fitted_slope([(r['pixels'], r['time_ms']) for r in rows
                         if r.get('time_ms') is not None])


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
    """The results as markdown tables: ours against the peer per size and mode, the
    reference paths, the fitted slopes, with_cp and the window sweep."""
    library = f" ({env['gemm_library']})" if env.get('gemm_library') else ''
    lines = [f"Device: {env['device']} ({env['threads']} threads), torch {env['torch']}, "
             f"{env['repeats']} interleaved repeats (medians); load average "
             f"{env['load_start']} at the start, {env['load_end']} at the end; fp32 GEMM "
             f"{env['gemm_size']}^3{library}: {fmt(env.get('gemm_gflop_per_s'), '.1f')} GFLOP/s "
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
    slopes = [(m, model, time_slope(rows)) for (m, model), rows in series(results).items()]
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
    """``time_vs_pixels.png`` and ``memory_vs_pixels.png`` (log-log, a panel per mode, the
    fitted slope of time in the legend) under ``out_dir``; returns their paths."""
    groups = series(results)
    paths = []
    for key, ylabel, fname in (('time_ms', 'time (ms)', 'time_vs_pixels.png'),
                               ('peak_mb', 'peak extra memory (MiB)', 'memory_vs_pixels.png')):
        modes = [m for m in MODES if any(r['mode'] == m and r.get(key) is not None
                                         for r in results if r['case'] == 'sizes')]
        if not modes:
            continue
        panels = []
        for mode in modes:
            lines = []
            for (m, model), rows in sorted(groups.items()):
                rows = [r for r in rows if r.get(key) is not None]
                if m != mode or not rows:
                    continue
                label = model
                if key == 'time_ms':
                    slope = time_slope(rows)
                    label += f' (slope {slope:.2f})' if slope is not None else ''
                ours = rows[0]['role'] == 'ours'
                lines.append((label, [r['pixels'] for r in rows], [r[key] for r in rows],
                              '-o' if ours else '--s'))
            what = 'forward, no grad' if mode == 'infer' else 'fwd + bwd'
            panels.append(dict(lines=lines, xlabel='input pixels', ylabel=ylabel,
                               title=f'{mode} ({what})'))
        paths.append(loglog_figure(panels, os.path.join(out_dir, fname),
                                   figsize=(7 * len(modes), 5), legend_fontsize=7))
    return paths


#: the paper's Fig. 3 (InLine attention; throughput on an RTX 3090): InLine over softmax,
#: images/s, by (comparison, setting): DeiT-T at 640 and 1024, Swin-T at windows 28 and 56
PAPER_FIG3 = {('deit', '640x640'): 2.4, ('deit', '1024x1024'): 4.8,
              ('swin', 'window 28'): 1.9, ('swin', 'window 56'): 3.7}
FIG3_NAMES = {'deit': 'DeiT-T vs InLine-DeiT-T', 'swin': 'Swin-T vs InLine-Swin-T'}


def fig3_markdown(rows, env):
    """The paper's Fig. 3 as a table: per comparison, setting and precision the images/s
    of the softmax model and of InLine, the measured ratio and the paper's beside it."""
    lines = [f"Paper Fig. 3 on {env['device']} (torch {env['torch']}): inference throughput "
             f"in images/s at batch {env['batch']}, median of {env['repeats']} interleaved "
             f"repeats; {env['precision_note']}", '',
             '| comparison | setting | precision | softmax img/s | InLine img/s | '
             'measured InLine / softmax | paper |', '|---|---|---|---|---|---|---|']
    for r in rows:
        paper = PAPER_FIG3.get((r['comparison'], r['setting']))
        ratio = fmt(r.get('ratio'), '.2f') + 'x' if r.get('ratio') else r.get('note', '-')
        lines.append(f"| {FIG3_NAMES[r['comparison']]} | {r['setting']} | {r['precision']} | "
                     f"{fmt(r.get('softmax_ips'), '.1f')} | {fmt(r.get('inline_ips'), '.1f')} | "
                     f"{ratio} | {fmt(paper, '.1f') + 'x' if paper else '-'} |")
    return '\n'.join(lines) + '\n'
