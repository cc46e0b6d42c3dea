"""The backbone race: each InLine backbone against the softmax backbone users would pick
instead (its peer), interleaved, at a resolution sweep, in inference and as a training
step; with_cp variants, the reference paths and the Swin window sweep. The tool is
``tools/analysis_tools/benchmark_backbones.py`` (:mod:`mmplugin_inline.cli.benchmark_backbones`,
whose docstring says what is measured); the tables and plots are
:mod:`mmplugin_inline.analysis.backbone_report`'s.
"""
import contextlib
import dataclasses
import json
import os
import platform
import statistics
from typing import List, Optional, Tuple

import torch

from mmplugin_inline.core.matmul_backend import cpu_linear_backend, linear

from .backbone_report import MODES, OURS, fig3_markdown, fmt, markdown, plot
from .measure import (
    extrapolate,
    interleaved_times,
    keep_freed_memory,
    load_average,
    over_budget,
    parse_size,
    peak_extra_memory,
)

FAMILIES = ('pvt', 'swin', 'cswin', 'deit')
DEFAULT_SIZES = ('224x224', '512x512', '800x1344', '1024x2048')
CP_VALUES = {'none': False, 'full': True, 'mlp': 'mlp', 'attn': 'attn'}
#: the paper's Fig. 3: DeiT-T input sides (640 and 1024 among them) and Swin windows (at 224)
FIG3_SIZES = (224, 384, 512, 640, 768, 1024)
FIG3_WINDOWS = (7, 14, 28, 56)
#: Fig. 3's precisions: fp32, and autocast to fp16 or bf16
PRECISIONS = {'fp32': None, 'fp16': torch.float16, 'bf16': torch.bfloat16}
PEERS = {'pvt': 'PVT-T (mmdet)', 'swin': 'Swin-T w7 (mmdet)', 'cswin': 'CSWin-T softmax',
         'deit': 'DeiT-T (timm)'}


@dataclasses.dataclass
class BackboneRaceOptions:
    """What :func:`run_benchmark` races, and how (the options of
    ``tools/analysis_tools/benchmark_backbones.py``, which takes its defaults from here).

    Args:
        families (list[str]): families of :data:`FAMILIES` to race, each against its peer
            (none: only the window sweep).
        sizes (list[tuple[int, int]]): (H, W) inputs of the resolution sweep.
        modes (list[str]): ``'infer'`` (no grad) and / or ``'train'`` (forward, a loss over
            all outputs, backward).
        with_cp (list[str]): keys of :data:`CP_VALUES`: our backbones also raced with those
            ``with_cp`` settings in the training steps.
        reference_paths (bool): also race our backbones on the reference paths
            (``mmplugin_inline.core.reference_paths``), same weights, same rounds.
        windows (list[int]): window sizes of the Swin window sweep (none: no sweep).
        window_size_input (tuple[int, int]): (H, W) input of the window sweep.
        repeats (int): interleaved timed rounds per case.
        device (str): where to run.
        threads (int, optional): CPU threads for torch; None keeps torch's setting.
        gemm_size (int): side of the fp32 matrix product timed as the hardware's rate.
        max_call_s (float): skip a model at sizes where its calls are predicted longer.
        max_memory_gb (float): skip a model at sizes where its peak is predicted larger.
        no_memory (bool): skip peak memory.
        no_flops (bool): skip FLOP counts.
        no_plots (bool): write no plots.
        out_dir (str): where ``results.json``, ``results.md`` and the plots go.
        paper_fig3 (bool): run the paper's Fig. 3 instead of the race
            (:func:`run_paper_fig3`).
        batch (int, optional): Fig. 3's batch (default: 16 on CUDA, 1 on the CPU).
        fig3_sizes (list[int]): Fig. 3's DeiT input sides.
        fig3_windows (list[int]): Fig. 3's Swin windows.
        fig3_input (int): the side of Fig. 3's Swin window sweep input.
        precisions (list[str], optional): Fig. 3's precisions, of :data:`PRECISIONS`
            (default: fp32 and fp16 autocast on CUDA, fp32 and bf16 autocast on the CPU).
    """
    families: List[str] = dataclasses.field(default_factory=lambda: list(FAMILIES))
    sizes: List[Tuple[int, int]] = dataclasses.field(
        default_factory=lambda: [parse_size(s) for s in DEFAULT_SIZES])
    modes: List[str] = dataclasses.field(default_factory=lambda: list(MODES))
    with_cp: List[str] = dataclasses.field(default_factory=list)
    reference_paths: bool = False
    windows: List[int] = dataclasses.field(default_factory=list)
    window_size_input: Tuple[int, int] = (224, 224)
    repeats: int = 5
    device: str = 'cpu'
    threads: Optional[int] = None
    gemm_size: int = 2048
    max_call_s: float = 60.0
    max_memory_gb: float = 16.0
    no_memory: bool = False
    no_flops: bool = False
    no_plots: bool = False
    out_dir: str = 'work_dirs/benchmark_backbones'
    paper_fig3: bool = False
    batch: Optional[int] = None
    fig3_sizes: List[int] = dataclasses.field(default_factory=lambda: list(FIG3_SIZES))
    fig3_windows: List[int] = dataclasses.field(default_factory=lambda: list(FIG3_WINDOWS))
    fig3_input: int = 224
    precisions: Optional[List[str]] = None


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
    for stage in model.stages:
        for blk in stage.blocks:
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


def race(models, hw, mode, options: BackboneRaceOptions, gemm, history, flops_cache, tag):
    """Measure ``models`` ({name: (model, meta)}) at one size and mode, interleaved."""
    device, pixels = options.device, hw[0] * hw[1]
    x = torch.randn(1, 3, *hw, device=device)
    rows, calls = {}, {}
    for name, (model, meta) in models.items():
        row = dict(meta, model=name, size=f'{hw[0]}x{hw[1]}', pixels=pixels, mode=mode,
                   case=tag, time_ms=None, peak_mb=None, gflops=None)
        rows[name] = row
        reason = predicted_over(history.setdefault((tag, name, mode), []), pixels,
                                options.max_call_s, options.max_memory_gb * 1024)
        if reason:
            row['note'] = reason
            continue
        if not options.no_flops:
            key = (name, hw)
            if key not in flops_cache:
                flops_cache[key] = forward_flops(model, x)
            row['gflops'] = flops_cache[key] / 1e9 * (3 if mode == 'train' else 1)
        model.train(mode == 'train')
        calls[name] = make_call(model, x, mode, meta.get('reference_paths', False))
    timed = interleaved_times(calls, options.repeats, device, reference=gemm,
                              max_warmup_s=options.max_call_s)
    for name in timed.over_cap:
        rows[name]['note'] = 'one timed call (the warm-up exceeded --max-call-s)'
    times, gemm_times = timed.times, timed.reference
    gemm_rate = options.gemm_size ** 3 / statistics.median(gemm_times) / 1e9 if gemm_times else None
    for name, ts in times.items():
        row = rows[name]
        row['times_ms'] = [1e3 * t for t in ts]
        row['time_ms'] = 1e3 * statistics.median(ts)
        if not options.no_memory:
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


def run_benchmark(options: BackboneRaceOptions) -> dict:
    """The races of ``options``: writes ``results.json``, ``results.md`` and the plots under
    ``options.out_dir``, prints the table; returns ``env``, ``results`` and ``plots``."""
    if options.threads:
        torch.set_num_threads(options.threads)
    if torch.device(options.device).type == 'cpu':
        keep_freed_memory()
    os.makedirs(options.out_dir, exist_ok=True)
    env = dict(device=str(options.device), threads=torch.get_num_threads(),
               torch=torch.__version__, machine=platform.processor() or platform.machine(),
               repeats=options.repeats, gemm_size=options.gemm_size, load_start=load_average(),
               gemm_library=(cpu_linear_backend() if torch.device(options.device).type == 'cpu'
                             else 'cuBLAS'))
    gemm = gemm_call(options.gemm_size, options.device)
    results, history, flops_cache = [], {}, {}

    def save_partial():  # a long run interrupted keeps what it measured
        with open(os.path.join(options.out_dir, 'results.json'), 'w') as f:
            json.dump(dict(env=env, partial=True, results=results), f, indent=1, default=str)
    cp_modes = [m for m in options.with_cp if m != 'none'] if 'train' in options.modes else []
    for family in options.families:
        base = {OURS[family]: (build_ours(family), dict(family=family, role='ours')),
                PEERS[family]: (build_peer(family), dict(family=family, role='peer'))}
        variants = {}
        if options.reference_paths:
            base[f'{OURS[family]} (reference paths)'] = (
                base[OURS[family]][0], dict(family=family, role='ours', reference_paths=True))
        if options.with_cp:
            base[OURS[family]][1]['with_cp'] = 'none'
            variants = {f'{OURS[family]} with_cp={m}': (
                build_ours(family, with_cp=CP_VALUES[m]),
                dict(family=family, role='ours', with_cp=m)) for m in cp_modes}
            for model, _ in variants.values():
                model.load_state_dict(base[OURS[family]][0].state_dict())
        for model, _ in list(base.values()) + list(variants.values()):
            model.to(options.device)
        for hw in options.sizes:
            for mode in options.modes:
                models = dict(base, **(variants if mode == 'train' else {}))
                rows = race(models, hw, mode, options, gemm, history, flops_cache, 'sizes')
                results += rows
                save_partial()
                for r in rows:
                    print(f"{r['model']:32s} {r['size']:>10s} {mode:5s} "
                          f"{fmt(r['time_ms'], '10.1f')} ms  {fmt(r['peak_mb'], '8.0f')} MiB  "
                          f"{r.get('note', '')}", flush=True)
    for window in options.windows:
        models = {name: (model.to(options.device),
                         dict(family='swin', window=window,
                              attention='inline' if name.startswith('InLine') else 'softmax',
                              role='ours' if name.startswith('InLine') else 'peer'))
                  for name, model in window_models(window, options.window_size_input).items()}
        for mode in options.modes:
            rows = race(models, options.window_size_input, mode, options, gemm, history,
                        flops_cache, 'windows')
            results += rows
            save_partial()
            for r in rows:
                print(f"{r['model']:32s} {r['size']:>10s} {mode:5s} "
                      f"{fmt(r['time_ms'], '10.1f')} ms", flush=True)
    env['load_end'] = load_average()
    rates = [r['gemm_gflop_per_s'] for r in results if r.get('gemm_gflop_per_s')]
    env['gemm_gflop_per_s'] = statistics.median(rates) if rates else None
    table = markdown(results, env)
    with open(os.path.join(options.out_dir, 'results.json'), 'w') as f:
        json.dump(dict(env=env, args=dataclasses.asdict(options),
                       results=results), f, indent=1, default=str)
    with open(os.path.join(options.out_dir, 'results.md'), 'w') as f:
        f.write(table)
    plots = [] if options.no_plots else plot(results, options.out_dir)
    print(table)
    print('wrote', ', '.join([os.path.join(options.out_dir, n) for n in ('results.json',
                                                                       'results.md')] + plots))
    return dict(env=env, results=results, plots=plots)


# -- the paper's Fig. 3 ---------------------------------------------------------------------

def fig3_precisions(device, asked=None):
    """(precisions, note): fp32 and fp16 autocast on CUDA (bf16 too where asked and the
    device has it); on the CPU fp32 and bf16 autocast, which stands in for fp16 there (the
    CPU's fp16 autocast runs few ops in fp16 and none faster); the note says which."""
    kind = torch.device(device).type
    if kind == 'cuda':
        wanted = asked or ['fp32', 'fp16']
        usable = [p for p in wanted if p != 'bf16' or torch.cuda.is_bf16_supported()]
        note = 'fp16 / bf16: torch.autocast on CUDA'
    else:
        wanted = asked or ['fp32', 'bf16']
        usable = [p for p in wanted if p != 'fp16']
        note = ('CPU: bf16 autocast stands in for the paper\'s fp16 (fp16 autocast is not '
                'measured on the CPU)')
    skipped = [p for p in wanted if p not in usable]
    if skipped:
        note += f"; skipped here: {', '.join(skipped)}"
    return usable, note


def fig3_pairs(options):
    """(comparison, setting, (H, W), {'softmax': model, 'inline': model}) of Fig. 3: DeiT-T
    against InLine-DeiT-T over ``fig3_sizes``, Swin-T against InLine-Swin-T over
    ``fig3_windows`` at ``fig3_input`` (windows cut to each stage's map)."""
    deit = {'softmax': build_peer('deit'), 'inline': build_ours('deit', out_indices=(11,))}
    for side in options.fig3_sizes:
        yield 'deit', f'{side}x{side}', (side, side), deit
    hw = (options.fig3_input, options.fig3_input)
    for window in options.fig3_windows:
        models = window_models(window, hw)
        yield 'swin', f'window {window}', hw, {
            'softmax': models[f'softmax windows {window}'],
            'inline': models[f'InLine windows {window}']}


def run_paper_fig3(options: BackboneRaceOptions) -> dict:
    """The paper's Fig. 3 on ``options.device``: inference throughput (images/s at one
    batch) of each softmax model and its InLine counterpart, interleaved, in each
    precision; the measured ratio beside the paper's. Writes ``results.json`` (``env``,
    ``paper_fig3``: the rows) and ``results.md`` under ``options.out_dir``."""
    if options.threads:
        torch.set_num_threads(options.threads)
    device = options.device
    kind = torch.device(device).type
    batch = options.batch or (16 if kind == 'cuda' else 1)
    precisions, note = fig3_precisions(device, options.precisions)
    os.makedirs(options.out_dir, exist_ok=True)
    env = dict(device=str(device), torch=torch.__version__, batch=batch,
               repeats=options.repeats, precisions=precisions, precision_note=note,
               machine=platform.processor() or platform.machine(), load_start=load_average(),
               threads=torch.get_num_threads())
    if kind == 'cuda':
        env['device_name'] = torch.cuda.get_device_name(torch.device(device))
        env['device'] = f"{device} ({env['device_name']})"
    rows = []
    for comparison, setting, hw, models in fig3_pairs(options):
        for model in models.values():
            model.to(device).eval()
        for precision in precisions:
            row = dict(comparison=comparison, setting=setting, precision=precision,
                       batch=batch, softmax_ips=None, inline_ips=None, ratio=None)
            rows.append(row)
            try:
                x = torch.randn(batch, 3, *hw, device=device)
                dtype = PRECISIONS[precision]

                def call(model, x=x, dtype=dtype):
                    ctx = (torch.autocast(kind, dtype=dtype) if dtype is not None
                           else contextlib.nullcontext())
                    with torch.no_grad(), ctx:
                        return model(x)
                timed = interleaved_times(
                    {name: (lambda m=m: call(m)) for name, m in models.items()},
                    options.repeats, device, max_warmup_s=options.max_call_s)
            except torch.cuda.OutOfMemoryError:
                row['note'] = f'out of memory at batch {batch}'
                torch.cuda.empty_cache()
                continue
            for name, times in timed.times.items():
                row[f'{name}_ips'] = batch / statistics.median(times)
                row[f'{name}_times_ms'] = [1e3 * t for t in times]
            if timed.over_cap:
                row['note'] = 'one timed call (the warm-up exceeded --max-call-s)'
            row['ratio'] = row['inline_ips'] / row['softmax_ips']
            print(f"{comparison:5s} {setting:>10s} {precision:5s} softmax "
                  f"{row['softmax_ips']:9.1f} img/s  InLine {row['inline_ips']:9.1f} img/s  "
                  f"{row['ratio']:.2f}x", flush=True)
        for model in models.values():
            model.to('cpu')
    env['load_end'] = load_average()
    table = fig3_markdown(rows, env)
    with open(os.path.join(options.out_dir, 'results.json'), 'w') as f:
        json.dump(dict(env=env, args=dataclasses.asdict(options), paper_fig3=rows), f,
                  indent=1, default=str)
    with open(os.path.join(options.out_dir, 'results.md'), 'w') as f:
        f.write(table)
    print(table)
    return dict(env=env, paper_fig3=rows)
