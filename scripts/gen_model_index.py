"""Measure every config and write the OpenMMLab model index (the files mim reads).

Usage::

    python scripts/gen_model_index.py [--no-flops | --flops-only NAME ...] [--cache JSON]
        [--check]

Writes ``configs/<folder>/metafile.yml`` for each config folder and ``model-index.yml``
(its ``Import:`` list) at the repository root. One Model entry per complete config
(``configs/**/*.py`` outside ``_base_``; the short-name config at the top of
``configs/`` is listed with InLine-PVT, whose model it is), plus one entry per released
ImageNet-1k backbone of the authors, whose ``Weights`` is the backbone's URL.

Numbers are measured, never typed in: parameters by building the model with random
weights (the whole detector / segmentor; mmseg's training-only auxiliary head left out
as ``get_flops.py`` does), FLOPs (multiply-accumulates) with
``mmplugin_inline.analysis.flops.get_flops`` (``tools/analysis_tools/get_flops.py``) at the
input shape written beside them (``torch.manual_seed(0)`` before each build, so the
proposals a two-stage detector's RPN keeps with random weights, and hence its FLOPs,
repeat). No ``Results`` are written: no run of these configs on COCO / ADE20K / Cityscapes
exists yet.

``--no-flops`` keeps the FLOPs already in the files and re-measures parameters only;
``--flops-only NAME ...`` measures FLOPs for those configs only (a full-size trace takes
minutes per config on 2 CPU cores) and keeps the others' recorded FLOPs;
``--cache FILE`` keeps the measurements in a JSON file and reuses them (a run resumes);
``--check`` writes nothing and exits 1 when the files differ from what it measured.
"""
import argparse
import glob
import os
import os.path as osp
import sys
from collections import OrderedDict

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PAPER = 'https://arxiv.org/abs/2412.06590'  # Han et al., NeurIPS 2024
AUTHORS_CODE = 'https://github.com/LeapLabTHU/InLine'
DET_SHAPE = (800, 1280)  # H x W, as in README's model zoo
SHORT_NAME_CONFIG = 'configs/mask_rcnn_inline_pvt.py'
DATASETS = {'CocoDataset': 'COCO', 'ADE20KDataset': 'ADE20K', 'CityscapesDataset': 'Cityscapes'}
TASKS = {'mmdet': 'Instance Segmentation', 'mmseg': 'Semantic Segmentation'}
SHAPES_DATA = 'Shapes (synthetic, tools/misc/make_shapes_dataset.py)'


def config_files():
    """Every complete config, relative to the repository (the ``_base_`` fragments excluded)."""
    found = glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
    rel = (osp.relpath(f, REPO) for f in found)
    return sorted(f for f in rel if '_base_' not in f.split(osp.sep))


def folder_of(config: str) -> str:
    """The config folder whose metafile lists ``config``."""
    if config == SHORT_NAME_CONFIG:
        return 'configs/inline_pvt'
    parts = config.split('/')
    if len(parts) != 3:
        raise ValueError(f'{config}: put configs in a folder configs/<name>/ (or list it in '
                         'scripts/gen_model_index.py like the short-name config)')
    return '/'.join(parts[:2])


def families():
    """{class name: backbone class} of the registered backbone families."""
    import mmplugin_inline  # noqa: F401  (registers the families)
    from mmplugin_inline.registry import registered_families
    return registered_families()


def family_title(cls) -> str:
    """'InLine-PVT' from the authors' model names ('InLine-PVT-T', ...)."""
    names = {name.rsplit('-', 1)[0] for name, _ in cls.released_weights.values()}
    if len(names) != 1:
        raise ValueError(f'{cls.__name__}: released model names do not share a family name')
    return names.pop()


def backbone_name(cls, arch) -> str:
    """The authors' name of a preset ('InLine-PVT-T'), or a description of a custom arch."""
    if isinstance(arch, str) and arch in cls.released_weights:
        return cls.released_weights[arch][0]
    return f'{family_title(cls)} ({arch})'


def measure_backbone(cls, arch: str, flops: bool) -> dict:
    """Params (and FLOPs at the preset's ImageNet size) of ``type=cls, arch=arch``."""
    import torch

    from mmplugin_inline.analysis import count_module
    from mmplugin_inline.registry import MODELS
    size = cls.arch_settings[arch].get('pretrain_img_size', 224)
    torch.manual_seed(0)
    model = MODELS.build(dict(type=cls.__name__, arch=arch)).eval()
    out = dict(params=sum(p.numel() for p in model.parameters()), size=size)
    if flops:
        out['flops'] = count_module(model, torch.zeros(1, 3, size, size))['flops']
    return out


def load_cfg(config: str):
    from mmplugin_inline.tools_common import codebase_of, load_config
    cfg = load_config(osp.join(REPO, config))
    return cfg, codebase_of(cfg)


def input_shape(cfg, codebase: str):
    """The shape FLOPs are counted at (H, W): the config's own ``img_scale`` (the demos,
    square), else 800 x 1280 for detectors and the training crop for segmentors."""
    if cfg.get('img_scale'):
        w, h = cfg.img_scale  # mmdet / mmseg scales are (W, H)
        return int(h), int(w)
    if codebase == 'mmdet':
        return DET_SHAPE
    crop = cfg.get('crop_size') or (512, 512)
    return tuple(int(s) for s in crop)


def measure_config(config: str, flops: bool) -> dict:
    """Params of the model and of its backbone; FLOPs at :func:`input_shape` if asked."""
    import torch

    from mmplugin_inline.analysis import build_model
    cfg, codebase = load_cfg(config)
    torch.manual_seed(0)
    model = build_model(cfg)
    out = dict(params=sum(p.numel() for p in model.parameters()),
               backbone_params=sum(p.numel() for p in model.backbone.parameters()),
               shape=input_shape(cfg, codebase))
    if flops:
        from mmplugin_inline.analysis.flops import get_flops
        torch.manual_seed(0)
        result = get_flops(cfg, out['shape'], model=model)
        rows = {name: (params, count) for name, params, count in result['rows']}
        out['flops'] = rows['model'][1]
        out['backbone_flops'] = rows['backbone'][1]
        if result['unknown_ops']:
            raise RuntimeError(f'{config}: ops with no FLOP handler: {result["unknown_ops"]}')
    return out


def config_metadata(config: str, cfg, codebase: str, fams: dict) -> dict:
    """What the config says: backbone, training data, schedule."""
    backbone = cfg.model.backbone
    cls = fams[backbone['type']]
    dataset = cfg.train_dataloader.dataset
    while 'dataset' in dataset:  # wrappers (RepeatDataset, ...)
        dataset = dataset['dataset']
    data = DATASETS.get(dataset.get('type'), dataset.get('type'))
    if 'shapes' in str(dataset.get('data_root', '')):
        data = SHAPES_DATA
    meta = OrderedDict()
    meta['Training Data'] = data
    meta['Backbone'] = backbone_name(cls, backbone.get('arch'))
    init = backbone.get('init_cfg') or {}
    meta['Pretrained'] = (f'ImageNet-1k ({init["checkpoint"]})'
                          if init.get('type') == 'Pretrained' else 'none (from scratch)')
    loop = cfg.get('train_cfg', {})
    budget = any(h.get('type') == 'TimeBudgetHook' for h in cfg.get('custom_hooks', []))
    if budget:
        meta['Training Budget'] = 'fixed time (TimeBudgetHook)'
    elif loop.get('type') == 'EpochBasedTrainLoop':
        meta['Epochs'] = int(loop['max_epochs'])
    elif loop.get('type') == 'IterBasedTrainLoop':
        meta['Iterations'] = int(loop['max_iters'])
    meta['Batch Size per GPU'] = int(cfg.train_dataloader.batch_size)
    meta['Architecture'] = [cfg.model.type, cls.__name__] + (
        [cfg.model.neck.type] if cfg.model.get('neck') else [])
    return meta


def fmt_m(n) -> str:
    return f'{n / 1e6:.2f}M'


def fmt_g(n) -> str:
    return f'{n / 1e9:.2f}G'


class Measurements:
    """Measured numbers by key, optionally kept in a JSON file between runs (``--cache``),
    so an interrupted run resumes and a change of layout needs no new measurement."""

    def __init__(self, path=None):
        import json
        self.path = path
        self.data = {}
        if path and osp.exists(path):
            with open(path) as f:
                self.data = json.load(f)

    def get(self, key, measure, flops: bool):
        if key not in self.data or (flops and 'flops' not in self.data[key]):
            self.data[key] = measure(flops)
            if self.path:
                import json
                with open(self.path, 'w') as f:
                    json.dump(self.data, f, indent=1)
        return self.data[key]


def build_index(flops: bool, old: dict, cache=None, flops_only=None) -> dict:
    """{folder: metafile dict} measured now.

    FLOPs are measured when ``flops`` is set, for the backbones and for the configs named
    in ``flops_only`` (basenames; None: every config); otherwise those already in ``old``
    are kept, or left out.
    """
    fams = families()
    measured = Measurements(cache)
    by_folder = OrderedDict()
    titles = {}
    for name, cls in sorted(fams.items(), key=lambda kv: kv[1].short_name):
        folder = f'configs/{cls.short_name}'
        titles[folder] = family_title(cls)
        models = []
        for arch, (model_name, url) in cls.released_weights.items():
            m = measured.get(f'backbone:{name}:{arch}',
                             lambda f: measure_backbone(cls, arch, f), flops)
            meta = OrderedDict()
            meta['Training Data'] = 'ImageNet-1k'
            meta['Parameters'] = m['params']
            meta['FLOPs'] = m['flops'] if 'flops' in m else _old_flops(old, folder, model_name)
            if meta['FLOPs'] is None:
                del meta['FLOPs']
            meta['Input Shape'] = f'3x{m["size"]}x{m["size"]}'
            meta['Checkpoint File'] = f'checkpoints/{cls.short_name}_{arch}.pth'
            meta['Architecture'] = [name]
            models.append(OrderedDict([
                ('Name', model_name), ('In Collection', titles[folder]), ('Metadata', meta),
                ('Weights', url), ('Code', AUTHORS_CODE)]))
            print(f'{model_name}: {fmt_m(m["params"])} {fmt_g(meta.get("FLOPs", 0))}',
                  flush=True)
        by_folder[folder] = models
    for config in config_files():
        folder = folder_of(config)
        cfg, codebase = load_cfg(config)
        if folder not in titles:  # a folder of its own (the demo)
            titles[folder] = 'InLine demo (synthetic shapes)'
            by_folder[folder] = []
        name = osp.splitext(osp.basename(config))[0]
        want = flops and (flops_only is None or name in flops_only)
        m = measured.get(config, lambda f: measure_config(config, f), want)
        meta = config_metadata(config, cfg, codebase, fams)
        meta['Parameters'] = m['params']
        meta['Backbone Parameters'] = m['backbone_params']
        for key, got in (('FLOPs', 'flops'), ('Backbone FLOPs', 'backbone_flops')):
            value = m[got] if got in m else _old_flops(old, folder, name, key)
            if value is not None:
                meta[key] = value
        meta['Input Shape'] = '3x{}x{}'.format(*m['shape'])
        meta['Task'] = TASKS[codebase]
        if config == SHORT_NAME_CONFIG:
            meta['Same Model As'] = 'mask-rcnn_inline-pvt-t_fpn_1x_coco'
        by_folder[folder].append(OrderedDict([('Name', name), ('In Collection', titles[folder]),
                                              ('Config', config), ('Metadata', meta)]))
        print(f'{config}: {fmt_m(m["params"])} {fmt_g(meta.get("FLOPs", 0))} at {m["shape"]}',
              flush=True)
    out = OrderedDict()
    for folder, models in by_folder.items():
        architecture = OrderedDict([('Architecture', ['InLine attention'])])
        collection = OrderedDict([('Name', titles[folder]), ('Metadata', architecture),
                                  ('Paper', PAPER)])
        if osp.isfile(osp.join(REPO, folder, 'README.md')):
            collection['README'] = f'{folder}/README.md'
        out[folder] = OrderedDict([('Collections', [collection]), ('Models', models)])
    return out


def _old_flops(old: dict, folder: str, name: str, key: str = 'FLOPs'):
    for model in old.get(folder, {}).get('Models', []):
        if model['Name'] == name:
            return model['Metadata'].get(key)
    return None


def read_existing() -> dict:
    import yaml
    out = {}
    for path in glob.glob(osp.join(REPO, 'configs', '*', 'metafile.yml')):
        with open(path) as f:
            out[osp.relpath(osp.dirname(path), REPO)] = yaml.safe_load(f)
    return out


HEADER = ('# Written by scripts/gen_model_index.py from measurements (do not edit by hand).\n'
          '# Parameters: counted on the built model (random weights); FLOPs: multiply-\n'
          '# accumulates counted by tools/analysis_tools/get_flops.py at Input Shape (H x W),\n'
          '# given where measured. No Results: no run of these configs exists yet.\n')


def dump(data) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(OrderedDict,
                           lambda d, v: d.represent_mapping('tag:yaml.org,2002:map', v.items()))
    return HEADER + yaml.dump(data, Dumper=Dumper, sort_keys=False, width=100)


README_BEGIN = '<!-- models: written by scripts/gen_model_index.py -->'
README_END = '<!-- /models -->'


def _count(meta, key, fmt):
    return fmt(meta[key]) if meta.get(key) is not None else ''


def readme_tables(folder: str, metafile: dict) -> str:
    """The Markdown tables of a folder README, from its metafile."""
    models = metafile['Models']
    out = []
    backbones = [m for m in models if 'Config' not in m]
    if backbones:
        out += ['ImageNet-1k backbones (the authors\' weights; params and FLOPs of the backbone '
                'as built with `type`, `arch` and the default options, no classifier):', '',
                '| backbone | input | params | FLOPs | weights | file |',
                '|---|---|---|---|---|---|']
        for m in backbones:
            meta = m['Metadata']
            size = meta['Input Shape'].split('x', 1)[1]
            out.append(f'| {m["Name"]} | {size} | {_count(meta, "Parameters", fmt_m)} | '
                       f'{_count(meta, "FLOPs", fmt_g)} | [download]({m["Weights"]}) | '
                       f'`{meta["Checkpoint File"]}` |')
        out.append('')
    for task, metrics in (('Instance Segmentation', ('box AP', 'mask AP')),
                          ('Semantic Segmentation', ('mIoU', ))):
        rows = sorted((m for m in models if m.get('Metadata', {}).get('Task') == task),
                      key=lambda m: (m['Metadata']['Parameters'], m['Name']))
        if not rows:
            continue
        datasets = sorted({m['Metadata']['Training Data'] for m in rows})
        out += [f'{task} ({", ".join(datasets)}):', '',
                '| config | backbone | pretrained | params (model / backbone) | '
                'FLOPs (model / backbone) | input (H x W) | ' + ' | '.join(metrics) + ' |',
                '|---' * (6 + len(metrics)) + '|']
        for m in rows:
            meta = m['Metadata']
            link = osp.relpath(osp.join(REPO, m['Config']), osp.join(REPO, folder))
            flops = (f'{_count(meta, "FLOPs", fmt_g)} / {_count(meta, "Backbone FLOPs", fmt_g)}'
                     if meta.get('FLOPs') is not None else '')
            shape = meta['Input Shape'].split('x', 1)[1]
            pretrained = 'ImageNet-1k' if meta['Pretrained'].startswith('ImageNet') else 'none'
            out.append(f'| [{m["Name"]}]({link}) | {meta["Backbone"]} | {pretrained} | '
                       f'{fmt_m(meta["Parameters"])} / {fmt_m(meta["Backbone Parameters"])} | '
                       f'{flops} | {shape} |' + ' |' * len(metrics))
        out.append('')
    return '\n'.join(out)


def with_tables(readme: str, folder: str, metafile: dict) -> str:
    """``readme`` with the text between the model markers replaced by the tables."""
    if README_BEGIN not in readme or README_END not in readme:
        raise ValueError(f'{folder}/README.md: the lines {README_BEGIN} and {README_END} '
                         'mark where the model tables go; add them')
    head, rest = readme.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    return f'{head}{README_BEGIN}\n{readme_tables(folder, metafile)}{README_END}{tail}'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--no-flops', action='store_true',
                        help='measure parameters only; keep the FLOPs in the files')
    parser.add_argument('--flops-only', nargs='+', metavar='NAME',
                        help='measure the FLOPs of these configs (basenames without .py) only; '
                        'the others keep the FLOPs already in the files, if any')
    parser.add_argument('--cache', metavar='JSON',
                        help='keep measurements in this file and reuse them (resumable runs)')
    parser.add_argument('--check', action='store_true',
                        help='write nothing; exit 1 if the files are not up to date')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    index = build_index(not args.no_flops, read_existing(), args.cache, args.flops_only)
    files = {f'{folder}/metafile.yml': dump(data) for folder, data in index.items()}
    files['model-index.yml'] = HEADER.splitlines()[0] + '\n' + dump_import(sorted(files))
    for folder, data in index.items():
        readme = osp.join(REPO, folder, 'README.md')
        if osp.isfile(readme):
            with open(readme) as f:
                files[f'{folder}/README.md'] = with_tables(f.read(), folder, data)
    stale = []
    for rel, text in files.items():
        path = osp.join(REPO, rel)
        current = open(path).read() if osp.exists(path) else None
        if current != text:
            stale.append(rel)
            if not args.check:
                with open(path, 'w') as f:
                    f.write(text)
    verb = 'differ from the measurements' if args.check else 'written'
    print(f'{len(stale)} file(s) {verb}: {", ".join(stale) or "none"}')
    return 1 if (args.check and stale) else 0


def dump_import(metafiles) -> str:
    return 'Import:\n' + ''.join(f'  - {m}\n' for m in metafiles)


if __name__ == '__main__':
    os.chdir(REPO)
    sys.exit(main())
