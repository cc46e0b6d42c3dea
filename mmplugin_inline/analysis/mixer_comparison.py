"""The paper's comparison in miniature: one config trained in several mixer variants.

A variant is a block-type string and the local residual switch (``'IIII'``,
``'IIII-nores'``: InLine without its local residual). Each variant is trained from the
same config for the same number of iterations, once per seed, and validated at the end;
the runs are summarised per variant (mean, sample standard deviation, range of the
metric; median time per iteration from the run's log), and every pair of variants is
called separated when their ranges over the seeds do not overlap.
"""
import json
import os
import os.path as osp
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

from .scalars import read_scalars

#: the suffix of a variant without the local residual
NO_RESIDUAL = '-nores'
#: the metric read from the validation of each codebase, unless one is named
DEFAULT_METRICS = {'mmseg': 'mIoU', 'mmdet': 'coco/bbox_mAP'}


@dataclass(frozen=True)
class Variant:
    """One backbone variant: its block types and whether its linear blocks keep their
    local residual."""
    block_types: str
    local_residual: bool = True

    @property
    def name(self) -> str:
        return self.block_types + ('' if self.local_residual else NO_RESIDUAL)

    @classmethod
    def parse(cls, text: str) -> 'Variant':
        """``'IIII'`` or ``'IIII-nores'``."""
        if text.endswith(NO_RESIDUAL):
            return cls(text[:-len(NO_RESIDUAL)], False)
        if not text or '-' in text:
            raise ValueError(f'a variant is block types, optionally followed by '
                             f'{NO_RESIDUAL!r} (e.g. IIII or IIII{NO_RESIDUAL}), got {text!r}')
        return cls(text)


@dataclass
class Run:
    """What one trained variant gave."""
    variant: str
    seed: int
    iters: int
    metric: float
    time_per_iter: float
    wall_s: float


def configure(cfg, variant: Variant, seed: int, iters: int, work_dir: str) -> None:
    """Set a loaded run config (in place) to train ``variant`` for ``iters`` iterations with
    ``seed``, validating once at the end and saving no checkpoint; a time budget of the
    config is removed (every variant trains the same iterations)."""
    backbone = cfg.model.backbone
    backbone.block_types = variant.block_types
    backbone.local_residual = variant.local_residual
    cfg.randomness = dict(seed=seed)
    if cfg.train_cfg.get('type') != 'IterBasedTrainLoop':
        raise ValueError('the comparison counts iterations: the config must use an '
                         f"IterBasedTrainLoop, not {cfg.train_cfg.get('type')!r}")
    cfg.train_cfg.max_iters = iters
    cfg.train_cfg.val_interval = iters
    cfg.custom_hooks = [h for h in cfg.get('custom_hooks', []) if h.get('type') != 'TimeBudgetHook']
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False,
                                        interval=iters + 1, save_last=False)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=max(1, min(25, iters // 4)),
                                    log_metric_by_epoch=False)
    cfg.log_processor = dict(by_epoch=False)
    cfg.work_dir = work_dir
    # mmengine keys its logger and message hub by the experiment name (by default the
    # config name and a timestamp in seconds), and the visualizer by its configured name
    # ('visualizer' in the mmdet / mmseg bases): the runs of one process would share
    # them, and write one log
    cfg.experiment_name = f'{osp.basename(work_dir)}_{time.time_ns()}'
    if cfg.get('visualizer'):
        cfg.visualizer.name = cfg.experiment_name



def metric_of(lines: List[dict], metric: str, work_dir: str) -> float:
    """The last logged value of ``metric`` (the final validation)."""
    values = [line[metric] for line in lines if metric in line]
    if not values:
        found = sorted({k for line in lines for k in line if k not in ('step', 'iter')})
        raise ValueError(f'{work_dir}: the validation logged no {metric!r}; logged: {found}')
    return float(values[-1])


def run_variant(config: str, variant: Variant, seed: int, iters: int, work_dir: str,
                cfg_options: Optional[dict] = None, metric: Optional[str] = None) -> Run:
    """Train and validate one variant with one seed; its log goes to ``work_dir``."""
    from mmplugin_inline import tools_common
    from mmplugin_inline.engine import runner_setup

    cfg, codebase = tools_common.load_run_config(config, cfg_options, 'none', work_dir)
    configure(cfg, variant, seed, iters, work_dir)
    runner = runner_setup.build_checked_runner(cfg, 'train')
    start = time.perf_counter()
    runner.train()
    wall = time.perf_counter() - start
    lines = read_scalars(work_dir)
    times = [line['time'] for line in lines if 'time' in line and 'loss' in line]
    return Run(variant.name, seed, iters, metric_of(lines, metric or DEFAULT_METRICS[codebase],
                                                    work_dir),
               statistics.median(times) if times else float('nan'), wall)


def summarise(runs: Sequence[Run]) -> Dict[str, dict]:
    """Per variant (in the order first run): the metric's mean, sample standard deviation
    (0 for one seed), min and max over the seeds, the median time per iteration."""
    out = {}
    for name in dict.fromkeys(r.variant for r in runs):
        values = [r.metric for r in runs if r.variant == name]
        out[name] = dict(mean=statistics.fmean(values),
                         std=statistics.stdev(values) if len(values) > 1 else 0.0,
                         min=min(values), max=max(values), seeds=len(values),
                         time_per_iter=statistics.median(r.time_per_iter for r in runs
                                                         if r.variant == name))
    return out


def separations(summary: Dict[str, dict]) -> List[dict]:
    """Every pair of variants, better first: separated when their ranges over the seeds
    do not overlap (with one seed per variant nothing is separated)."""
    names = sorted(summary, key=lambda n: -summary[n]['mean'])
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            sa, sb = summary[a], summary[b]
            separated = sa['seeds'] > 1 and sb['seeds'] > 1 and sa['min'] > sb['max']
            pairs.append(dict(better=a, worse=b, difference=sa['mean'] - sb['mean'],
                              separated=separated))
    return pairs


def report(summary: Dict[str, dict], pairs: List[dict], metric: str) -> str:
    """The summary and the pairs as a markdown text."""
    lines = [f'| variant | {metric} mean ± std | range | seeds | s / iter |',
             '|---|---|---|---|---|']
    for name, s in sorted(summary.items(), key=lambda kv: -kv[1]['mean']):
        lines.append(f"| {name} | {s['mean']:.4g} ± {s['std']:.2g} | {s['min']:.4g} - "
                     f"{s['max']:.4g} | {s['seeds']} | {s['time_per_iter']:.3f} |")
    lines += ['', '| better | worse | difference | beyond the seeds\' spread |',
              '|---|---|---|---|']
    for p in pairs:
        lines.append(f"| {p['better']} | {p['worse']} | {p['difference']:+.4g} | "
                     f"{'yes (ranges apart)' if p['separated'] else 'no (inconclusive)'} |")
    return '\n'.join(lines) + '\n'


def compare(config: str, variants: Sequence[Variant], seeds: Sequence[int], iters: int,
            out_dir: str, cfg_options: Optional[dict] = None,
            metric: Optional[str] = None, log=print) -> dict:
    """Train every variant with every seed (``out_dir/<variant>_seed<k>``); after each
    run, ``results.json`` and ``results.md`` of the runs so far go into ``out_dir``.
    Returns the results."""
    from mmplugin_inline import tools_common
    if iters < 1 or not seeds or not variants:
        raise ValueError('the comparison needs at least one variant, one seed and one iteration')
    _, codebase = tools_common.load_tool_config(config, cfg_options)
    metric = metric or DEFAULT_METRICS[codebase]
    runs = []
    for seed in seeds:  # seed-major: a stopped comparison has every variant of its seeds
        for variant in variants:
            work = osp.join(out_dir, f'{variant.name}_seed{seed}')
            log(f'[compare] {variant.name}, seed {seed}: {iters} iterations -> {work}')
            run = run_variant(config, variant, seed, iters, work, cfg_options, metric)
            log(f'[compare] {variant.name}, seed {seed}: {metric} {run.metric:.4g}, '
                f'{run.time_per_iter:.3f} s / iter')
            runs.append(run)
            # written after every run: a comparison stopped early keeps what it has
            results = write_results(out_dir, config, metric, iters, seeds, runs)
    log(report(results['summary'], results['pairs'], metric))
    return results


def write_results(out_dir: str, config: str, metric: str, iters: int, seeds: Sequence[int],
                  runs: Sequence[Run]) -> dict:
    """``results.json`` (every run, the summary, the pairs) and ``results.md`` of the runs
    so far, in ``out_dir``; returns the results."""
    summary = summarise(runs)
    pairs = separations(summary)
    results = dict(config=config, metric=metric, iters=iters, seeds=list(seeds),
                   runs=[asdict(r) for r in runs], summary=summary, pairs=pairs)
    os.makedirs(out_dir, exist_ok=True)
    with open(osp.join(out_dir, 'results.json'), 'w') as f:
        json.dump(results, f, indent=1)
    with open(osp.join(out_dir, 'results.md'), 'w') as f:
        f.write(report(summary, pairs, metric))
    return results
