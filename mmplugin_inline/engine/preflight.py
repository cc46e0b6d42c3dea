"""Check the files a run needs before the runner starts, and say how to get them.

``tools/train.py`` and ``tools/test.py`` call :func:`preflight` after the config is
final. A missing dataset, pretrained checkpoint or checkpoint to resume from is reported
as one message -- what is missing, where it was looked for, how to get it -- instead of
a stack trace from deep inside a dataset class or ``torch.load``. A COCO-style
annotation file that lists images missing from the image folder is reported too, naming
them (one directory listing per folder, and the json read only up to its ``images``).
"""
import json
import os
import os.path as osp
from typing import Iterable, Iterator, List, Optional, Tuple

from mmplugin_inline.registry import released_weights
from mmplugin_inline.weights.download import is_url, probe_url

AUTHORS_PAGE = 'https://github.com/LeapLabTHU/InLine#pretrained-models'

SYNTHETIC_HINT = ('For a quick try without the real data, tools/misc/make_shapes_dataset.py '
                  'generates a small COCO / ADE20K-style set.')
DATASET_HINTS = {
    'CocoDataset': (
        'COCO 2017: download train2017.zip, val2017.zip and annotations_trainval2017.zip from '
        'https://cocodataset.org/#download and unzip them into data/coco/ '
        '(data/coco/annotations/instances_train2017.json, data/coco/train2017/, '
        'data/coco/val2017/).'),
    'ADE20KDataset': (
        'ADE20K (SceneParsing, ADEChallengeData2016): download '
        'http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip and unzip it '
        'into data/ade/ (data/ade/ADEChallengeData2016/images/training, .../annotations/'
        'training, ...).'),
    'CityscapesDataset': (
        'Cityscapes: register at https://www.cityscapes-dataset.com, download '
        'leftImg8bit_trainvaltest.zip and gtFine_trainvaltest.zip into data/cityscapes/, '
        'then make the *_labelTrainIds.png maps with mmsegmentation\'s '
        '`python tools/dataset_converters/cityscapes.py data/cityscapes --nproc 8`.'),
}
DATASET_WRAPPER_KEYS = ('dataset', 'datasets')


def _is_remote(path: str) -> bool:
    return '://' in path or path.startswith('open-mmlab:')


def _join(root: Optional[str], path: str) -> str:
    return path if (not root or osp.isabs(path)) else osp.join(root, path)


def _leaf_datasets(cfg) -> Iterator[dict]:
    """Dataset configs under a dataloader's dataset, through wrappers (Repeat, Concat, ...)."""
    if isinstance(cfg, (list, tuple)):
        for item in cfg:
            yield from _leaf_datasets(item)
        return
    if not isinstance(cfg, dict):
        return
    inner = [cfg[k] for k in DATASET_WRAPPER_KEYS if k in cfg]
    if inner:
        for item in inner:
            yield from _leaf_datasets(item)
    else:
        yield cfg


def dataset_paths(dataset: dict) -> List[Tuple[str, str, bool]]:
    """``(what, path, is_file)`` for the annotation file and data folders of a dataset
    config, resolved against ``data_root`` the way mmengine's ``BaseDataset`` does."""
    root = dataset.get('data_root') or ''
    paths = []
    if root and not _is_remote(root):
        paths.append(('data_root', root, False))
    ann_file = dataset.get('ann_file') or ''
    if ann_file:
        paths.append(('ann_file', _join(root, ann_file), True))
    prefix = dataset.get('data_prefix') or {}
    if isinstance(prefix, str):
        prefix = dict(img_path=prefix)
    for key, value in prefix.items():
        if value:
            paths.append((f'data_prefix.{key}', _join(root, value), False))
    return [(w, p, f) for w, p, f in paths if not _is_remote(p)]


def _missing_paths(dataset: dict) -> List[str]:
    paths = dataset_paths(dataset)
    if paths and paths[0][0] == 'data_root' and not osp.isdir(paths[0][1]):
        paths = paths[:1]  # everything else lives under it
    return [f'{what} {path} ({osp.abspath(path)})' for what, path, is_file in paths
            if not (osp.isfile(path) if is_file else osp.isdir(path))]


def json_top_level_value(path: str, key: str, chunk: int = 1 << 20):
    """The value of ``key`` in the JSON object stored in ``path``, reading the file only
    up to the end of that value (COCO files list their ``images`` before the large
    ``annotations``); None when the key is absent or the file is not such a JSON object
    (the dataset's own loader then reports it)."""
    decoder = json.JSONDecoder()
    with open(path, encoding='utf-8') as f:
        buf, eof = '', False

        def more() -> bool:
            nonlocal buf, eof
            data = f.read(max(chunk, len(buf)))  # doubling: each value is parsed <= 2x
            eof = not data
            buf += data
            return not eof

        def skip_space(pos: int) -> int:
            while True:
                while pos < len(buf) and buf[pos].isspace():
                    pos += 1
                if pos < len(buf) or not more():
                    return pos

        def value(pos: int):
            while True:  # a value that ends at the end of the buffer may continue after it
                try:
                    item, end = decoder.raw_decode(buf, pos)
                    if end < len(buf) or eof:
                        return item, end
                except json.JSONDecodeError:
                    if eof:
                        raise
                more()

        try:
            pos = skip_space(0)
            if buf[pos:pos + 1] != '{':
                return None
            pos = skip_space(pos + 1)
            while buf[pos:pos + 1] == '"':
                name, pos = value(pos)
                pos = skip_space(pos)
                if buf[pos:pos + 1] != ':':
                    return None
                item, pos = value(skip_space(pos + 1))
                if name == key:
                    return item
                buf, pos = buf[pos:], 0  # keep only what is not parsed yet
                pos = skip_space(pos)
                if buf[pos:pos + 1] != ',':
                    return None
                pos = skip_space(pos + 1)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
    return None


def missing_images(dataset: dict) -> Optional[str]:
    """A paragraph when the COCO-style annotation file of ``dataset`` (a json with
    ``images[].file_name``, read as mmdet's CocoDataset does: under ``data_prefix.img``)
    lists images that are not there, naming them; None otherwise. One directory listing
    per folder of images, however many images the file lists."""
    root = dataset.get('data_root') or ''
    ann_file, prefix = dataset.get('ann_file') or '', dataset.get('data_prefix') or {}
    if not isinstance(prefix, dict) or 'img' not in prefix or _is_remote(root) \
            or _is_remote(prefix['img']) or not str(ann_file).endswith('.json'):
        return None
    ann_path, img_dir = _join(root, ann_file), _join(root, prefix['img'])
    if not osp.isfile(ann_path) or not osp.isdir(img_dir):
        return None
    images = json_top_level_value(ann_path, 'images')
    if not isinstance(images, list):
        return None
    names = [im['file_name'] for im in images if isinstance(im, dict)
             and isinstance(im.get('file_name'), str)]
    listings = {}
    missing = []
    for name in names:
        folder, base = osp.split(name)
        if folder not in listings:
            try:
                listings[folder] = set(os.listdir(osp.join(img_dir, folder)))
            except OSError:
                listings[folder] = set()
        if base not in listings[folder]:
            missing.append(name)
    if not missing:
        return None
    shown = ', '.join(missing[:5]) + (f' and {len(missing) - 5} more' if len(missing) > 5 else '')
    return (f'The annotation file {ann_path} lists {len(missing)} of its {len(names)} images '
            f'that are not in {img_dir} ({osp.abspath(img_dir)}): {shown}. Put the missing '
            'images there (an incomplete download or unzip?), point data_prefix.img at the '
            'folder that holds them, or remove their entries from the annotation file.')


def dataset_problems(cfg, dataloaders: Iterable[str]) -> List[str]:
    """One paragraph per missing dataset of ``dataloaders`` (shared ones named once), and
    one per annotation file listing missing images (:func:`missing_images`)."""
    found = {}  # (dataset type, missing paths, data_root) -> dataloaders
    images = {}  # paragraph on missing images -> dataloaders
    for loader_key in dataloaders:
        loader = cfg.get(loader_key)
        if not loader:
            continue
        for dataset in _leaf_datasets(loader.get('dataset')):
            missing = _missing_paths(dataset)
            if missing:
                key = (dataset.get('type', 'dataset'), tuple(missing),
                       dataset.get('data_root') or '')
                found.setdefault(key, []).append(loader_key)
                continue
            problem = missing_images(dataset)
            if problem:
                images.setdefault(problem, []).append(loader_key)
    problems = []
    for (kind, missing, root), loaders in found.items():
        hint = DATASET_HINTS.get(kind, 'See the mmdetection / mmsegmentation dataset '
                                       'preparation guides.')
        elsewhere = (f'link it into place (`ln -s /path/to/it {root.rstrip("/")}`) or ' if root
                     else '') + 'set the paths in your config'
        problems.append(
            f'The {kind} data of {" and ".join(loaders)} is missing: ' + '; '.join(missing) +
            f' not found. How to get it: {hint} If you have it elsewhere, {elsewhere}. '
            f'{SYNTHETIC_HINT}')
    problems += [f'The data of {" and ".join(loaders)}: {problem}'
                 for problem, loaders in images.items()]
    return problems


def evaluator_problems(cfg, evaluators: Iterable[str]) -> List[str]:
    """Paragraphs for missing annotation files of evaluators (e.g. CocoMetric's ann_file)."""
    problems = []
    for key in evaluators:
        node = cfg.get(key)
        for metric in (node if isinstance(node, (list, tuple)) else [node]):
            path = metric.get('ann_file') if isinstance(metric, dict) else None
            if path and not _is_remote(path) and not osp.isfile(path):
                problems.append(f'The annotation file of {key} ({metric.get("type")}), {path} '
                                f'({osp.abspath(path)}), is missing: it comes with the dataset '
                                '(see above), or set ann_file in your config.')
    return problems


def _pretrained_entries(node, where: str) -> Iterator[Tuple[str, str]]:
    """``(config key, checkpoint path)`` of every ``Pretrained`` init_cfg under ``node``."""
    if isinstance(node, dict):
        init_cfg = node.get('init_cfg')
        for init in (init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]):
            if isinstance(init, dict) and init.get('type') == 'Pretrained' \
                    and init.get('checkpoint'):
                yield f'{where}.init_cfg.checkpoint', str(init['checkpoint'])
        pretrained = node.get('pretrained')
        if isinstance(pretrained, str):
            yield f'{where}.pretrained', pretrained
        for key, value in node.items():
            if key != 'init_cfg':
                yield from _pretrained_entries(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _pretrained_entries(value, f'{where}.{i}')


def weights_hint(path: str) -> str:
    """How to get the pretrained weights expected at ``path``."""
    name, released = osp.basename(path), released_weights()
    if name in released:
        model, url = released[name]
        return (f'download the {model} ImageNet-1K weights released by the InLine authors '
                f'({AUTHORS_PAGE}): `mkdir -p {osp.dirname(path) or "."} && wget -O {path} '
                f'"{url}"`')
    return f'put the checkpoint there (the InLine authors publish theirs at {AUTHORS_PAGE})'


def _url_problem(url: str, key: str) -> Optional[str]:
    """A paragraph when the checkpoint URL set by ``key`` cannot be fetched, else None."""
    if not is_url(url):
        return None  # s3://, open-mmlab:// ...: left to mmengine's loaders
    problem = probe_url(url)
    return f'{problem} (set by {key})' if problem else None


def checkpoint_problems(cfg, check_pretrained: bool = True) -> List[str]:
    """Paragraphs for missing local checkpoints and unreachable checkpoint URLs:
    pretrained weights named in the model (when ``check_pretrained``) and ``load_from``."""
    problems = []
    if check_pretrained:
        for key, path in _pretrained_entries(cfg.get('model'), 'model'):
            if _is_remote(path):
                problems += [p for p in [_url_problem(path, key)] if p]
                continue
            if osp.isfile(path):
                continue
            problems.append(
                f'The pretrained weights {path} ({osp.abspath(path)}, set by {key}) are '
                f'missing. How to get them: {weights_hint(path)}. To train from scratch '
                f'instead: --cfg-options {key.rsplit(".checkpoint", 1)[0]}=None.')
    load_from = cfg.get('load_from')
    if load_from and _is_remote(str(load_from)):
        problems += [p for p in [_url_problem(str(load_from), 'load_from')] if p]
    elif load_from and not osp.isfile(load_from):
        what = 'resume from' if cfg.get('resume') else 'load'
        problems.append(f'The checkpoint to {what}, {load_from} ({osp.abspath(load_from)}), '
                        'does not exist. Check the path (a training run writes them into its '
                        'work directory, e.g. work_dirs/CONFIG_NAME/epoch_12.pth).')
    return problems


def _data_problems(cfg, loaders, evaluators) -> List[str]:
    # an evaluator's annotation file normally comes with the dataset: one message is enough
    return dataset_problems(cfg, loaders) or evaluator_problems(cfg, evaluators)


def preflight(cfg, mode: str) -> List[str]:
    """Problems that would stop a run of ``mode`` ('train' or 'test'); empty when none.

    'train' checks the training data, the validation data (when a validation loop is
    configured), the pretrained weights and ``load_from`` / the resume checkpoint; 'test'
    checks the test data and the checkpoint to test (pretrained weights are not used).
    """
    if mode == 'train':
        loaders = ['train_dataloader']
        if cfg.get('val_cfg') is not None and cfg.get('val_evaluator') is not None:
            loaders.append('val_dataloader')
        evaluators = ['val_evaluator'] if 'val_dataloader' in loaders else []
        return _data_problems(cfg, loaders, evaluators) + checkpoint_problems(cfg)
    if mode == 'test':
        return (_data_problems(cfg, ['test_dataloader'], ['test_evaluator']) +
                checkpoint_problems(cfg, check_pretrained=False))
    raise ValueError(f"mode must be 'train' or 'test', not {mode!r}")


def format_problems(problems: List[str]) -> str:
    """The text the tools print (one paragraph per problem)."""
    head = ('Cannot start: a file the run needs is missing or cannot be fetched.'
            if len(problems) == 1 else
            f'Cannot start: {len(problems)} files the run needs are missing or cannot be fetched.')
    return '\n'.join([head] + [f'- {p}' for p in problems])

