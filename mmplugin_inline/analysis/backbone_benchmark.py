"""The backbone race: each InLine backbone against the softmax backbone users would pick
instead (its peer), interleaved, at a resolution sweep, in inference and as a training
step; with_cp variants, the reference paths and the Swin window sweep. The tool is
``tools/analysis_tools/benchmark_backbones.py`` (:mod:`mmplugin_inline.cli.benchmark_backbones`,
whose docstring says what is measured); the tables and plots are
:mod:`mmplugin_inline.analysis.backbone_report`'s.
"""
import json
import os
import platform
import statistics

import torch

from mmplugin_inline.core.matmul_backend import cpu_linear_backend, linear

from .backbone_report import OURS, fmt, markdown, plot
from .measure import (extrapolate, interleaved_times, keep_freed_memory, load_average,
                      over_budget, peak_extra_memory)

FAMILIES = ('pvt', 'swin', 'cswin', 'deit')
DEFAULT_SIZES = ('224x224', '512x512', '800x1344', '1024x2048')
CP_VALUES = {'none': False, 'full': True, 'mlp': 'mlp', 'attn': 'attn'}
PEERS = {'pvt': 'PVT-T (mmdet)', 'swin': 'Swin-T w7 (mmdet)', 'cswin': 'CSWin-T softmax',
         'deit': 'DeiT-T (timm)'}


class Tokens(torch.nn.Module):
    """A timm ViT's patch tokens (``forward_features``) as a one-element tuple."""

    def __init__(self, vit):
        super().__init__()
        self.vit = vit

    def forward(self, x):
        return (self.vit.forward_features(x),)


def build_ours(family, with_cp=False, **kw):
    from .. import models  # noqa: F401  (registers the backbones)
    from ..registry import MODELS
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
    from ..models.layers import WindowAttention, relative_position_index
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
    from ..core import reference_paths
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
    """A size^3 fp32 product through the library our linear layers use on ``device``
    (``core.matmul_backend.linear``: oneDNN or BLAS on the CPU, cuBLAS on CUDA): the
    rate a model's products could reach, whichever library a model calls."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    return lambda: linear(a, b)


def forward_flops(model, x):
    from .complexity import flop_analyzer
    model.eval()
    with torch.no_grad():
        return flop_analyzer(model, (x,)).total()


def predicted_over(history, pixels, max_s, max_mb):
    """A reason to skip from the last measured sizes of a model (log-log extrapolation),
    or None."""
    done = [h for h in history if h.get('time_ms') is not None]
    seconds = extrapolate([(h['pixels'], h['time_ms'] / 1e3) for h in done], pixels)
    if seconds is None:
        return None
    # memory from its own points: activations grow with the pixels (slope 1 from one
    # measured size; a fitted slope from two), not as the time does (a softmax peer's
    # time grows with the square of the tokens, its fused attention's memory does not)
    peak_mb = extrapolate([(h['pixels'], h.get('peak_mb')) for h in done], pixels,
                          default_slope=1.0)
    return over_budget(seconds, max_s, peak_mb, max_mb)


def race(models, hw, mode, args, gemm, history, flops_cache, tag):
    """Measure ``models`` ({name: (model, meta)}) at one size and mode, interleaved."""
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


def run_benchmark(args):
    """The races of ``args`` (the options of ``tools/analysis_tools/benchmark_backbones.py``);
    writes ``results.json``, ``results.md`` and the plots under ``args.out_dir``, prints the
    table; returns ``env``, ``results`` and ``plots``."""
    if torch.device(args.device).type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit(f'--device {args.device} asked for, but CUDA is not available here')
    if args.threads:
        torch.set_num_threads(args.threads)
    if torch.device(args.device).type == 'cpu':
        keep_freed_memory()
    os.makedirs(args.out_dir, exist_ok=True)
    env = dict(device=str(args.device), threads=torch.get_num_threads(),
               torch=torch.__version__, machine=platform.processor() or platform.machine(),
               repeats=args.repeats, gemm_size=args.gemm_size, load_start=load_average(),
               gemm_library=(cpu_linear_backend() if torch.device(args.device).type == 'cpu'
                             else 'cuBLAS'))
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
    env['load_end'] = load_average()
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
