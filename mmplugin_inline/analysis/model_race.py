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

``tools/analysis_tools/benchmark_models.py`` is the command line over
:func:`run_race`.
"""
import argparse
import contextlib
import copy
import gc
import json
import os
import os.path as osp
import platform
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .model_and_batch import build_model, dummy_data_batch, dummy_train_batch
from .measure import extrapolate, interleaved_times, load_average, peak_extra_memory

ROLES = ('ours', 'peer')
#: a training step costs about this many forwards (to predict its time for --max-call-s)
TRAIN_OVER_INFER = 3.0


@dataclass(frozen=True)
class Pair:
    """Two whole models that differ only in the backbone.

    Attributes:
        key: the name on the command line.
        ours: our model's name in tables.
        peer: the softmax model's name in tables.
        config: our config, relative to the plugin's ``configs/``.
        peer_backbone: the backbone config that replaces ours in the peer.
        channels: the backbone's output channels, which both models share (what the
            config's neck / head take).
    """
    key: str
    ours: str
    peer: str
    config: str
    peer_backbone: dict
    channels: Tuple[int, ...]


#: mmseg's Swin-T as its UperNet configs build it (``_base_/models/upernet_swin.py`` with
#: ``swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py``)
SWIN_T = dict(type='SwinTransformer', pretrain_img_size=224, embed_dims=96, patch_size=4,
              window_size=7, mlp_ratio=4, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
              strides=(4, 2, 2, 2), out_indices=(0, 1, 2, 3), qkv_bias=True, qk_scale=None,
              patch_norm=True, drop_rate=0., attn_drop_rate=0., drop_path_rate=0.3,
              use_abs_pos_embed=False, act_cfg=dict(type='GELU'),
              norm_cfg=dict(type='LN', requires_grad=True))
#: mmdet's PVT-T as ``mask-rcnn_pvt-t-p4_fpn_1x_coco.py`` builds it (the class defaults
#: are PVT-T's widths, heads, reductions and MLP ratios; depths 2-2-2-2)
PVT_T = dict(type='PyramidVisionTransformer', num_layers=[2, 2, 2, 2], drop_path_rate=0.1,
             out_indices=(0, 1, 2, 3))

PAIRS = {pair.key: pair for pair in (
    Pair('upernet-swin', 'UperNet InLine-Swin-T', 'UperNet Swin-T',
         'inline_swin/upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py', SWIN_T,
         (96, 192, 384, 768)),
    # mmseg has no PVT: mmdet's, from the mmseg registry across scopes
    Pair('fpn-pvt', 'Semantic FPN InLine-PVT-T', 'Semantic FPN PVT-T',
         'inline_pvt/fpn_inline-pvt-t_8xb4-40k_ade20k-512x512.py',
         dict(PVT_T, type='mmdet.PyramidVisionTransformer'), (64, 128, 320, 512)),
    Pair('mask-rcnn-pvt', 'Mask R-CNN InLine-PVT-T', 'Mask R-CNN PVT-T',
         'inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py', PVT_T, (64, 128, 320, 512)),
)}

DEFAULT_SIZES = ('512x512', '1024x1024', '1024x2048')


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


def parse_size(text: str) -> Tuple[int, int]:
    """'HxW' -> (H, W); 'S' -> (S, S)."""
    try:
        values = tuple(int(v) for v in str(text).lower().split('x'))
    except ValueError:
        values = ()
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or min(values) < 1:
        raise ValueError(f'sizes are HxW (or S for SxS), e.g. 1024x2048; got {text!r}')
    return values


def config_root() -> str:
    """The plugin's ``configs/``: in an installed package's ``.mim/``, else beside the
    package in a source checkout."""
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    for root in (osp.join(package, '.mim', 'configs'), osp.join(osp.dirname(package), 'configs')):
        if osp.isdir(root):
            return root
    raise FileNotFoundError(f'no configs/ in {package}/.mim or beside {package}')


def backbone_channels(model_cfg: dict) -> Tuple[int, ...]:
    """The backbone channels a config's neck (or, without one, decode head) takes."""
    taker = model_cfg.get('neck') or model_cfg['decode_head']
    return tuple(taker['in_channels'])


def pair_configs(pair: Pair, root: Optional[str] = None):
    """Our config and the peer's (mmengine Configs), both with random weights.

    The peer is ours with ``pair.peer_backbone`` in place of the backbone. Every
    ``init_cfg`` of the backbones and the model's ``pretrained`` are None, so building
    or initialising reads nothing.
    """
    from ..tools_common import load_config
    ours = load_config(osp.join(root or config_root(), pair.config))
    if backbone_channels(ours.model) != tuple(pair.channels):
        raise ValueError(f'{pair.config} takes backbone channels {backbone_channels(ours.model)}'
                         f', but {pair.key} races backbones of {pair.channels}')
    if 'pretrained' in ours.model:
        ours.model.pretrained = None
    ours.model.backbone.init_cfg = None
    peer = copy.deepcopy(ours)
    peer.model.backbone = dict(pair.peer_backbone, init_cfg=None)
    return ours, peer


def num_classes_of(model_cfg: dict) -> int:
    """Classes of a segmentor's decode head or of a detector's box head."""
    if 'decode_head' in model_cfg:
        return model_cfg['decode_head']['num_classes']
    head = model_cfg['roi_head']['bbox_head']
    return (head[0] if isinstance(head, (list, tuple)) else head)['num_classes']


def adapt_config(cfg, codebase: str, args):
    """A copy of a pair's config set up for the race's options.

    A segmentor's preprocessor pads training batches to the crop it trains on: here the
    training-step size. With ``args.detections``, a detector keeps that many detections
    per image (score threshold 0, so there are always enough): random weights leave few
    boxes above the config's threshold, and not as many for both models, so the mask
    head and the pasting of masks would do different (and unrealistically little) work.
    """
    cfg = copy.deepcopy(cfg)
    if codebase == 'mmseg' and not args.no_train:
        cfg.model.data_preprocessor.size = tuple(args.train_size)
    if codebase == 'mmdet' and args.detections:
        cfg.model.test_cfg.rcnn.update(score_thr=0.0, max_per_img=args.detections)
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
              args, measured: dict) -> dict:
    """Measure both models of ``pair`` on ``case``, interleaved; one row."""
    slide_crop, slide_stride = tuple(args.slide_crop), tuple(args.slide_stride)
    row = dict(pair=pair.key, ours=pair.ours, peer=pair.peer, codebase=codebase,
               kind=case.kind, size=case.size_text, pixels=case.size[0] * case.size[1],
               mode=case.mode, batch=case.batch, note='')
    for role in ROLES:
        row.update({f'{role}_s': None, f'{role}_times': [], f'{role}_peak_mb': None})
    row.update(speedup=None, peak_ratio=None)
    if case.mode == 'slide':
        row['crops'] = slide_crops(case.size, slide_crop, slide_stride)
    predicted = predicted_seconds(case, measured, slide_crop, slide_stride)
    if predicted is not None and predicted > args.max_call_s:
        row['note'] = f'skipped: predicted {predicted:.0f} s a call > --max-call-s'
        return row
    gc.collect()
    slide_cfg = dict(mode='slide', crop_size=slide_crop, stride=slide_stride)
    seen = {role: {} for role in ROLES}
    calls = {role: make_call(models[role], codebase, case, num_classes, seen[role])
             for role in ROLES}
    with contextlib.ExitStack() as stack:
        for role in ROLES:
            stack.enter_context(CaseSettings(models[role], case, slide_cfg))
        timed = interleaved_times(calls, args.repeats, args.device, warmup=args.warmup,
                                  max_warmup_s=args.max_call_s)
        for role in ROLES:
            # a call over the cap is not run once more for its memory
            if not args.no_memory and role not in timed.over_cap:
                row[f'{role}_peak_mb'] = peak_extra_memory(calls[role], args.device) / 2 ** 20
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


def ratio(a, b) -> Optional[float]:
    """a / b, or None if either is missing or b is zero."""
    return a / b if a is not None and b else None


def fmt(value, spec: str) -> str:
    """``value`` formatted with ``spec``, or '-' when it is None."""
    return '-' if value is None else format(value, spec)


def markdown(rows: List[dict], env: dict) -> str:
    """The race's tables: every case, then whole against slide where both ran."""
    header = (
        f"Device: {env['device']} ({env['threads']} threads), torch {env['torch']}; "
        f"{env['repeats']} interleaved repeat(s) after {env['warmup']} warm-up (medians); load "
        f"average {env['load_start']} at the start, {env.get('load_end', '?')} at the end. "
        'Random weights. Inference: batch 1, data preprocessor + test_step (predict).')
    if any(r['kind'] == 'train' for r in rows):
        header += (f" Training step: batch {env['train_batch']} with ground truth, forward "
                   'with losses + backward, no optimizer step.')
    header += ' Time per image; peak: extra memory during one call.'
    if env.get('detections'):
        header += (f" Detectors keep {env['detections']} detections per image (score "
                   'threshold 0).')
    lines = [
        header,
        '',
        '| pair | case | size | mode | ours s/img | peer s/img | speed-up (peer / ours) | '
        'ours / peer peak MiB | note |',
        '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        speed = ratio(r['peer_s'], r['ours_s'])
        lines.append(
            f"| {r['ours']} vs {r['peer']} | {r['kind']} | {r['size']} | {r['mode']} | "
            f"{fmt(r['ours_s'], '.3f')} | {fmt(r['peer_s'], '.3f')} | "
            f"{fmt(speed, '.2f')}{'x' if speed is not None else ''} | "
            f"{fmt(r['ours_peak_mb'], ',.0f')} / {fmt(r['peer_peak_mb'], ',.0f')} | "
            f"{r.get('note', '')} |")
    slides = [r for r in rows if r['mode'] == 'slide' and r['ours_s'] and r['peer_s']]
    pairs_of_modes = []
    for s in slides:
        whole = next((r for r in rows if r['pair'] == s['pair'] and r['size'] == s['size'] and
                      r['mode'] == 'whole' and r['ours_s'] and r['peer_s']), None)
        if whole is not None:
            pairs_of_modes.append((whole, s))
    if pairs_of_modes:
        lines += [
            '', 'Whole against slide (s/img; slide / whole > 1: one whole pass is cheaper; '
            'the last column: how much faster our whole pass is than the softmax model '
            'sliding):', '',
            '| pair | size | crops | ours whole | ours slide | ours slide / whole | '
            'peer whole | peer slide | peer slide / whole | peer slide / ours whole |',
            '|---|---|---|---|---|---|---|---|---|---|']
        for whole, s in pairs_of_modes:
            lines.append(
                f"| {whole['ours']} vs {whole['peer']} | {s['size']} | {s.get('crops', '-')} | "
                f"{whole['ours_s']:.3f} | {s['ours_s']:.3f} | "
                f"{ratio(s['ours_s'], whole['ours_s']):.2f} | {whole['peer_s']:.3f} | "
                f"{s['peer_s']:.3f} | {ratio(s['peer_s'], whole['peer_s']):.2f} | "
                f"{ratio(s['peer_s'], whole['ours_s']):.2f}x |")
    counts = [r for r in rows if r.get('ours_instances') is not None]
    if counts:
        lines += ['', 'Detections per image in the last timed call (the mask head and the '
                  'pasting of masks work on these): ' +
                  '; '.join(f"{r['size']}: ours {r['ours_instances']}, peer "
                            f"{r.get('peer_instances')}" for r in counts)]
    return '\n'.join(lines) + '\n'


def add_race_options(parser) -> None:
    """The options of ``tools/analysis_tools/benchmark_models.py`` (the script makes the
    parser, as mmdet's tools do); check the parsed values with :func:`check_race_args`."""
    def size(text):
        try:
            return parse_size(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc))

    parser.add_argument('--pairs', nargs='+', choices=sorted(PAIRS), default=list(PAIRS),
                        help='pairs to race (default: all)')
    parser.add_argument('--sizes', nargs='+', type=size, metavar='HxW',
                        default=[parse_size(s) for s in DEFAULT_SIZES],
                        help=f'inference sizes (default: {" ".join(DEFAULT_SIZES)})')
    parser.add_argument('--train-size', type=size, default=(512, 512), metavar='HxW',
                        help='training-step size (default: 512x512)')
    parser.add_argument('--no-train', action='store_true', help='no training step')
    parser.add_argument('--train-batch', type=int, default=2, metavar='N',
                        help="images per training step (default: 2; UperNet's pooling "
                             'branch ends in a 1x1 map, which BatchNorm cannot train on '
                             'with one image)')
    parser.add_argument('--slide-crop', type=size, default=(1024, 1024), metavar='HxW',
                        help="segmentors' slide-mode crop (default: 1024x1024)")
    parser.add_argument('--slide-stride', type=size, default=(768, 768), metavar='HxW',
                        help="segmentors' slide-mode stride (default: 768x768)")
    parser.add_argument('--detections', type=int, default=None, metavar='N',
                        help='detectors keep N detections per image (score threshold 0; '
                             'there are always enough), so that both models post-process '
                             'the same; '
                             "default: the config's test_cfg (random weights: few boxes)")
    parser.add_argument('--repeats', type=int, default=2,
                        help='timed rounds per case (default: 2)')
    parser.add_argument('--warmup', type=int, default=1,
                        help='warm-up rounds per case (default: 1)')
    parser.add_argument('--threads', type=int, default=None, help='CPU threads (torch)')
    parser.add_argument('--device', default='cpu', help='cpu or cuda (cuda:N)')
    parser.add_argument('--max-call-s', type=float, default=600.0,
                        help='skip a case whose call is predicted (from the smaller sizes) '
                             'to take longer; time a call whose warm-up took longer only '
                             'once (default: 600)')
    parser.add_argument('--no-memory', action='store_true', help='skip peak memory')
    parser.add_argument('--out-dir', default='work_dirs/benchmark_models')


def check_race_args(args) -> Optional[str]:
    """What is wrong with parsed options (a message for ``parser.error``), or None."""
    if args.repeats < 1:
        return '--repeats must be at least 1'
    if args.warmup < 1:
        return '--warmup must be at least 1 (the first call of a model is not timed)'
    if args.train_batch < 1:
        return '--train-batch must be at least 1'
    if args.threads is not None and args.threads < 1:
        return '--threads must be at least 1'
    if args.detections is not None and args.detections < 1:
        return '--detections must be at least 1'
    if args.max_call_s <= 0:
        return '--max-call-s must be positive'
    return None


def run_race(args, configs: Optional[Dict[str, tuple]] = None) -> dict:
    """Race the pairs of ``args`` (see :func:`add_race_options`); write ``results.json``
    and ``results.md`` under ``args.out_dir``; return ``env``, ``rows`` and ``table``.

    ``configs`` (``{pair key: (ours Config, peer Config)}``) replaces
    :func:`pair_configs` for those pairs (e.g. shrunk models).
    """
    from ..tools_common import codebase_of
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out_dir, exist_ok=True)
    env = dict(device=str(args.device), threads=torch.get_num_threads(),
               torch=torch.__version__, machine=platform.processor() or platform.machine(),
               repeats=args.repeats, warmup=args.warmup, train_batch=args.train_batch,
               detections=args.detections, load_start=load_average())
    rows = []

    def save(partial):  # an interrupted run keeps what it measured
        with open(osp.join(args.out_dir, 'results.json'), 'w') as f:
            json.dump(dict(env=env, args=vars(args), partial=partial, rows=rows), f, indent=1,
                      default=str)

    for key in args.pairs:
        pair = PAIRS[key]
        ours_cfg, peer_cfg = (configs or {}).get(key) or pair_configs(pair)
        codebase = codebase_of(ours_cfg)
        ours_cfg, peer_cfg = (adapt_config(cfg, codebase, args) for cfg in (ours_cfg, peer_cfg))
        models = {'ours': build_model(ours_cfg, args.device, drop_auxiliary_head=False),
                  'peer': build_model(peer_cfg, args.device, drop_auxiliary_head=False)}
        num_classes = num_classes_of(ours_cfg.model)
        measured = {}
        for case in race_cases(codebase, args.sizes, None if args.no_train else args.train_size,
                               args.train_batch, tuple(args.slide_crop)):
            row = race_case(pair, models, codebase, case, num_classes, args, measured)
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
    with open(osp.join(args.out_dir, 'results.md'), 'w') as f:
        f.write(table)
    return dict(env=env, rows=rows, table=table)
