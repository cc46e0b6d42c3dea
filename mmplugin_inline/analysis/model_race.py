"""The whole-model race: our configs' models against the softmax models users would train.

A pair is two models of one config that differ only in the backbone: ours (the config
as shipped) and the peer (the same detector / segmentor with the softmax backbone of
the same size, as mmdet / mmseg configure it). Both are built with random weights
(``init_cfg=None``, ``pretrained=None``; nothing is read or downloaded).

Cases, per pair:

- inference at each size, batch 1, through the model's data preprocessor and
  ``test_step`` (predict mode, with post-processing), as
  ``tools/analysis_tools/benchmark.py`` runs it; mode ``whole``;
- segmentors also in mmseg's ``slide`` mode (crops of ``slide_crop`` at ``slide_stride``)
  at every size larger than a crop, beside ``whole``;
- a training step at ``train_size``: a batch of ``train_batch`` images with ground truth
  (:func:`~mmplugin_inline.analysis.model_and_batch.dummy_train_batch`) through the data
  preprocessor (training mode), the losses, and their backward (no optimizer step). The
  auxiliary heads that train with the model are kept.

The two models of a pair alternate call by call
(:func:`~mmplugin_inline.analysis.measure.interleaved_times`); the reported time per
image is the median call over its batch. Peak memory is what tensors allocated during
one more call occupy at once beyond the weights
(:func:`~mmplugin_inline.analysis.measure.peak_extra_memory`). A case whose predicted
call (from the pair's smaller sizes) is longer than ``max_call_s`` is skipped, with the
reason in the table; a call whose warm-up took longer is timed once.

A row of the results: ``pair``, ``ours`` / ``peer`` (names), ``codebase``, ``kind``,
``size``, ``pixels``, ``mode``, ``batch``, ``crops`` (slide), and per role
(``ours_`` / ``peer_``): ``s`` (median seconds per image), ``times`` (seconds of each
timed call), ``peak_mb`` and, for detectors, ``instances`` (detections per image in
the last call); ``speedup`` (peer / ours time), ``peak_ratio`` (ours / peer memory) and
``note`` (why a case was skipped or timed once).

``tools/analysis_tools/benchmark_models.py`` (:mod:`mmplugin_inline.cli.benchmark_models`,
with the options) is the command line over :func:`run_race`; the tables are
:mod:`mmplugin_inline.analysis.model_race_report`'s.
"""
import contextlib
import copy
import dataclasses
import gc
import json
import os
import os.path as osp
import platform
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .measure import (
    extrapolate,
    interleaved_times,
    load_average,
    over_budget,
    parse_size,
    peak_extra_memory,
)
from .model_and_batch import build_model, dummy_data_batch, dummy_train_batch
from .model_race_pairs import PAIRS, Pair, num_classes_of, pair_configs
from .model_race_report import fmt, markdown, ratio

ROLES = ('ours', 'peer')
#: a training step costs about this many forwards (to predict its time for --max-call-s)
TRAIN_OVER_INFER = 3.0


DEFAULT_SIZES = ('512x512', '1024x1024', '1024x2048')


@dataclass
class ModelRaceOptions:
    """What :func:`run_race` races, and how (the options of
    ``tools/analysis_tools/benchmark_models.py``, which takes its defaults from here).

    Args:
        pairs (list[str]): keys of :data:`PAIRS` to race.
        sizes (list[tuple[int, int]]): (H, W) inference sizes.
        train_size (tuple[int, int]): (H, W) of the training step.
        no_train (bool): no training step.
        train_batch (int): images per training step (UperNet's pooling branch ends in a
            1x1 map, which BatchNorm cannot train on with one image).
        slide_crop (tuple[int, int]): segmentors' slide-mode crop.
        slide_stride (tuple[int, int]): segmentors' slide-mode stride.
        detections (int, optional): detectors keep this many detections per image (see
            :func:`adapt_config`); None keeps the config's test_cfg.
        repeats (int): timed rounds per case.
        warmup (int): warm-up rounds per case.
        threads (int, optional): CPU threads for torch; None keeps torch's setting.
        device (str): ``'cpu'`` or ``'cuda'`` (``'cuda:N'``).
        max_call_s (float): skip a case whose call is predicted (from the smaller sizes)
            to take longer; a call whose warm-up took longer is timed only once.
        no_memory (bool): skip peak memory.
        out_dir (str): where ``results.json`` and ``results.md`` go.
    """
    pairs: List[str] = dataclasses.field(default_factory=lambda: list(PAIRS))
    sizes: List[Tuple[int, int]] = dataclasses.field(
        default_factory=lambda: [parse_size(s) for s in DEFAULT_SIZES])
    train_size: Tuple[int, int] = (512, 512)
    no_train: bool = False
    train_batch: int = 2
    slide_crop: Tuple[int, int] = (1024, 1024)
    slide_stride: Tuple[int, int] = (768, 768)
    detections: Optional[int] = None
    repeats: int = 2
    warmup: int = 1
    threads: Optional[int] = None
    device: str = 'cpu'
    max_call_s: float = 600.0
    no_memory: bool = False
    out_dir: str = 'work_dirs/benchmark_models'


@dataclass(frozen=True)
class Case:
    """One measurement of a pair.

    Attributes:
        kind: 'infer' or 'train'.
        size: the input (H, W) of each image.
        mode: 'whole' or 'slide' (inference), 'train'.
        batch: images per call.
    """
    kind: str
    size: Tuple[int, int]
    mode: str
    batch: int = 1

    @property
    def size_text(self) -> str:
        """'HxW'."""
        return f'{self.size[0]}x{self.size[1]}'


def adapt_config(cfg, codebase: str, options: ModelRaceOptions):
    """A copy of a pair's config set up for the race's options.

    A segmentor's preprocessor pads training batches to the crop it trains on: here the
    training-step size. With ``options.detections``, a detector keeps that many detections
    per image (score threshold 0, so there are always enough): random weights leave few
    boxes above the config's threshold, and not as many for both models, so the mask
    head and the pasting of masks would do different (and unrealistically little) work.
    """
    cfg = copy.deepcopy(cfg)
    if codebase == 'mmseg' and not options.no_train:
        cfg.model.data_preprocessor.size = tuple(options.train_size)
    if codebase == 'mmdet' and options.detections:
        cfg.model.test_cfg.rcnn.update(score_thr=0.0, max_per_img=options.detections)
    return cfg


def race_cases(codebase: str, sizes: Sequence[Tuple[int, int]], train_size, train_batch: int,
               slide_crop: Tuple[int, int]) -> List[Case]:
    """The cases of a pair in the order they run: inference at each size (smaller first;
    a segmentor also in ``slide`` mode where the image is larger than a crop), then the
    training step (None: none)."""
    cases = []
    for size in sorted(sizes, key=lambda s: (s[0] * s[1], s)):
        cases.append(Case('infer', tuple(size), 'whole'))
        if codebase == 'mmseg' and (size[0] > slide_crop[0] or size[1] > slide_crop[1]):
            cases.append(Case('infer', tuple(size), 'slide'))
    if train_size:
        cases.append(Case('train', tuple(train_size), 'train', train_batch))
    return cases


def slide_crops(size: Tuple[int, int], crop: Tuple[int, int], stride: Tuple[int, int]) -> int:
    """Crops mmseg's ``slide_inference`` runs on an image of ``size``."""
    grids = [max(s - c + t - 1, 0) // t + 1 for s, c, t in zip(size, crop, stride)]
    return grids[0] * grids[1]


class CaseSettings:
    """Puts a model into a case's state (train / eval, mmseg's test mode) and back."""

    def __init__(self, model, case: Case, slide_cfg: dict):
        self.model, self.case, self.slide_cfg = model, case, slide_cfg

    def __enter__(self):
        self.saved = (self.model.training, getattr(self.model, 'test_cfg', None))
        self.model.train(self.case.kind == 'train')
        if self.case.mode == 'slide':
            from mmengine.config import ConfigDict
            self.model.test_cfg = ConfigDict(self.slide_cfg)
        return self.model

    def __exit__(self, *exc):
        training, test_cfg = self.saved
        self.model.train(training)
        if self.case.mode == 'slide':
            self.model.test_cfg = test_cfg
        return False


def make_call(model, codebase: str, case: Case, num_classes: int, seen: Optional[dict] = None):
    """One call of ``case`` on ``model`` (in the case's state), on a batch made here once.

    Each call copies the batch's data samples (predict writes its results into them, the
    training preprocessor pads their ground truth), not the images. ``seen`` (when
    given) receives the instances each image got in the last detection call.
    """
    if case.kind == 'train':
        batch = dummy_train_batch(codebase, case.size, num_classes, case.batch)
    else:
        batch = dummy_data_batch(codebase, case.size, case.batch)
    device = next(model.parameters()).device
    inputs = [img.to(device) for img in batch['inputs']]

    def fresh():
        return dict(inputs=inputs, data_samples=[s.clone() for s in batch['data_samples']])

    if case.kind == 'train':
        def call():
            data = model.data_preprocessor(fresh(), True)
            loss, _ = model.parse_losses(model(**data, mode='loss'))
            loss.backward()
            for p in model.parameters():
                p.grad = None
        return call

    def call():
        with torch.no_grad():
            results = model.test_step(fresh())
        if seen is not None and codebase == 'mmdet':
            seen['instances'] = [len(r.pred_instances) for r in results]
        return results
    return call


def predicted_seconds(case: Case, measured: Dict[Tuple[str, str], List[Tuple[int, float]]],
                      slide_crop, slide_stride) -> Optional[float]:
    """A case's call time predicted from the pair's measured whole inference calls
    (``measured[('infer', 'whole')]``: (pixels, seconds of the slower model)), or None."""
    points = measured.get(('infer', 'whole'), [])
    pixels = case.size[0] * case.size[1]
    if case.mode == 'slide':
        per_crop = extrapolate(points, slide_crop[0] * slide_crop[1])
        return None if per_crop is None else \
            per_crop * slide_crops(case.size, slide_crop, slide_stride)
    if case.kind == 'train':
        one = extrapolate(points, pixels)
        return None if one is None else TRAIN_OVER_INFER * one * case.batch
    return extrapolate(points, pixels)


def race_case(pair: Pair, models: dict, codebase: str, case: Case, num_classes: int,
              options: ModelRaceOptions, measured: dict) -> dict:
    """Measure both models of ``pair`` on ``case``, interleaved; one row."""
    slide_crop, slide_stride = tuple(options.slide_crop), tuple(options.slide_stride)
    row = dict(pair=pair.key, ours=pair.ours, peer=pair.peer, codebase=codebase,
               kind=case.kind, size=case.size_text, pixels=case.size[0] * case.size[1],
               mode=case.mode, batch=case.batch, note='')
    for role in ROLES:
        row.update({f'{role}_s': None, f'{role}_times': [], f'{role}_peak_mb': None})
    row.update(speedup=None, peak_ratio=None)
    if case.mode == 'slide':
        row['crops'] = slide_crops(case.size, slide_crop, slide_stride)
    skip = over_budget(predicted_seconds(case, measured, slide_crop, slide_stride),
                       options.max_call_s)
    if skip:
        row['note'] = skip
        return row
    gc.collect()
    slide_cfg = dict(mode='slide', crop_size=slide_crop, stride=slide_stride)
    seen = {role: {} for role in ROLES}
    calls = {role: make_call(models[role], codebase, case, num_classes, seen[role])
             for role in ROLES}
    with contextlib.ExitStack() as stack:
        for role in ROLES:
            stack.enter_context(CaseSettings(models[role], case, slide_cfg))
        timed = interleaved_times(calls, options.repeats, options.device, warmup=options.warmup,
                                  max_warmup_s=options.max_call_s)
        for role in ROLES:
            # a call over the cap is not run once more for its memory
            if not options.no_memory and role not in timed.over_cap:
                row[f'{role}_peak_mb'] = peak_extra_memory(calls[role], options.device) / 2 ** 20
    for role in ROLES:
        times = timed.times[role]
        row[f'{role}_times'] = times
        row[f'{role}_s'] = statistics.median(times) / case.batch
        if seen[role].get('instances') is not None:
            row[f'{role}_instances'] = seen[role]['instances']
    row['speedup'] = ratio(row['peer_s'], row['ours_s'])
    row['peak_ratio'] = ratio(row['ours_peak_mb'], row['peer_peak_mb'])
    if timed.over_cap:
        row['note'] = (f'{" and ".join(timed.over_cap)}: one timed call, no memory (the '
                       'warm-up took longer than --max-call-s)')
    if case.mode == 'whole':
        measured.setdefault((case.kind, case.mode), []).append(
            (row['pixels'], max(statistics.median(timed.times[r]) for r in ROLES)))
    return row


def run_race(options: ModelRaceOptions, configs: Optional[Dict[str, tuple]] = None) -> dict:
    """Race the pairs of ``options``; write ``results.json`` and ``results.md`` under
    ``options.out_dir``; return ``env``, ``rows`` and ``table``.

    ``configs`` (``{pair key: (ours Config, peer Config)}``) replaces
    :func:`pair_configs` for those pairs (e.g. shrunk models).
    """
    from ..tools_common import codebase_of
    if options.threads:
        torch.set_num_threads(options.threads)
    os.makedirs(options.out_dir, exist_ok=True)
    env = dict(device=str(options.device), threads=torch.get_num_threads(),
               torch=torch.__version__, machine=platform.processor() or platform.machine(),
               repeats=options.repeats, warmup=options.warmup, train_batch=options.train_batch,
               detections=options.detections, load_start=load_average())
    rows = []

    def save(partial):  # an interrupted run keeps what it measured
        with open(osp.join(options.out_dir, 'results.json'), 'w') as f:
            json.dump(dict(env=env, args=dataclasses.asdict(options), partial=partial,
                           rows=rows), f, indent=1, default=str)

    for key in options.pairs:
        pair = PAIRS[key]
        ours_cfg, peer_cfg = (configs or {}).get(key) or pair_configs(pair)
        codebase = codebase_of(ours_cfg)
        ours_cfg, peer_cfg = (adapt_config(cfg, codebase, options) for cfg in (ours_cfg, peer_cfg))
        models = {'ours': build_model(ours_cfg, options.device, drop_auxiliary_head=False),
                  'peer': build_model(peer_cfg, options.device, drop_auxiliary_head=False)}
        num_classes = num_classes_of(ours_cfg.model)
        measured = {}
        train_size = None if options.no_train else options.train_size
        for case in race_cases(codebase, options.sizes, train_size, options.train_batch,
                               tuple(options.slide_crop)):
            row = race_case(pair, models, codebase, case, num_classes, options, measured)
            rows.append(row)
            save(partial=True)
            print(f"{pair.key:14s} {case.kind:5s} {case.size_text:>10s} {case.mode:5s} "
                  f"ours {fmt(row['ours_s'], '9.3f')} s/img  peer {fmt(row['peer_s'], '9.3f')} "
                  f"s/img  {row['note']}", flush=True)
        del models
        gc.collect()
    env['load_end'] = load_average()
    table = markdown(rows, env)
    save(partial=False)
    with open(osp.join(options.out_dir, 'results.md'), 'w') as f:
        f.write(table)
    return dict(env=env, rows=rows, table=table)
