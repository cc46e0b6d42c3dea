"""Predict on images and draw the results: boxes and masks (mmdet) or a segmentation
overlay (mmseg), as mmdet's ``demo/image_demo.py`` does.

Usage::

    python demo/image_demo.py INPUTS CONFIG [--weights CKPT] [--out-dir outputs]
        [--device cpu|cuda] [--pred-score-thr 0.3] [--opacity 0.5] [--batch-size 1]
        [--print-result] [--show] [--allow-unsafe] [--cfg-options KEY=VALUE ...]

    python demo/image_demo.py demo/shapes.jpg configs/demo/fpn_inline-pvt-t_shapes-demo.py

``INPUTS`` is an image, a folder (its images, not its sub-folders) or a quoted glob
pattern (``'data/shapes_demo/images/validation/00000*.jpg'``). Which codebase the
config belongs to is its ``default_scope``, else the codebase whose registry has the
model type (``mmplugin_inline.tools_common``); the pictures are drawn by mmdet's
``DetInferencer`` (``DetLocalVisualizer``) or mmseg's ``MMSegInferencer``
(``SegLocalVisualizer``) and written to ``OUT_DIR/vis/<image name>`` (mmseg also writes
the predicted label maps to ``OUT_DIR/pred/``), ``--batch-size`` images at a time
(mmseg's data preprocessor batches only images of one size: an error says so).
``--print-result`` prints each prediction: mmdet's result dict (labels, scores, boxes),
or for mmseg the fraction of the image given to each predicted class. ``--show`` opens
a window per picture; without a display it says so and only writes the pictures.

Without ``--weights`` the model is randomly initialised (a warning says so): useful
to check that a config runs, not to look at. Class names and colours come from the
checkpoint's meta data, else from the config's test dataset.

Checkpoints written by ``tools/train.py`` load with ``torch.load(weights_only=True)``
and the allow-list of what mmengine saves; a file that needs full unpickling is
refused unless ``--allow-unsafe`` is given (only for files you trust).

``demo/shapes.jpg`` (224 x 224, four shapes of the three classes on a noisy
background; 34 KB) was made by
``python tools/misc/make_shapes_dataset.py /tmp/s --train 1 --val 0 --min-size 224
--max-size 224 --noisy 1 --seed 3 --formats ade`` (``images/training/000000.jpg``).
"""
import argparse
import glob
import os
import os.path as osp
import warnings

from mmplugin_inline.utils.env_check import assert_environment

RANDOM_WEIGHTS_WARNING = ('WARNING: no --weights given: the model is randomly initialised, so '
                          'the picture shows what an untrained model predicts.')


def dataset_meta_from_config(cfg, codebase: str) -> dict:
    """``classes`` and ``palette`` of the config's test dataset (its ``metainfo`` first,
    then the dataset class's ``METAINFO``); numbered classes if neither is found."""
    import importlib
    dataset = cfg.get('test_dataloader', {}).get('dataset', {})
    meta = dict(dataset.get('metainfo') or {})
    dataset_cls = importlib.import_module(f'{codebase}.registry').DATASETS.get(
        dataset.get('type', ''))
    for key, value in getattr(dataset_cls, 'METAINFO', {}).items():
        meta.setdefault(key, value)
    if not meta.get('classes'):
        head = cfg.model.get('decode_head') or cfg.model.get('roi_head', {}).get('bbox_head', {})
        num = head.get('num_classes', 1) if isinstance(head, dict) else 1
        meta['classes'] = tuple(f'class{i}' for i in range(num))
    if not meta.get('palette') or len(meta['palette']) < len(meta['classes']):
        import numpy as np
        rng = np.random.RandomState(0)
        meta['palette'] = [tuple(int(c) for c in rng.randint(0, 256, 3))
                           for _ in meta['classes']]
    return dict(classes=tuple(meta['classes']), palette=list(meta['palette']))


IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')


def list_images(inputs: str) -> list:
    """The image files ``inputs`` names: itself, a folder's images or a glob's matches.

    Raises:
        FileNotFoundError: when it names no image, saying which of the three it was.
    """
    if osp.isfile(inputs):
        return [inputs]
    if osp.isdir(inputs):
        found = sorted(osp.join(inputs, name) for name in os.listdir(inputs)
                       if name.lower().endswith(IMAGE_SUFFIXES))
        if not found:
            raise FileNotFoundError(f'no image ({", ".join(IMAGE_SUFFIXES)}) in the folder '
                                    f'{inputs}')
        return found
    if glob.has_magic(inputs):
        found = sorted(p for p in glob.glob(inputs) if osp.isfile(p))
        if not found:
            raise FileNotFoundError(f'no file matches the pattern {inputs}')
        return found
    raise FileNotFoundError(f'image not found: {inputs} (give an image, a folder or a quoted '
                            'glob pattern)')


def _print_segmentation(images, results, classes) -> None:
    """One json line per image: the fraction of its pixels given to each class."""
    import json

    import numpy as np
    predictions = results['predictions']
    if not isinstance(predictions, list):
        predictions = [predictions]
    for image, labels in zip(images, predictions):
        ids, counts = np.unique(np.asarray(labels), return_counts=True)
        fractions = {str(classes[i]) if i < len(classes) else str(i): round(c / labels.size, 4)
                     for i, c in zip(ids.tolist(), counts.tolist())}
        print(json.dumps(dict(image=image, shape=list(labels.shape), classes=fractions)))


def run_demo(inputs: str, config, out_dir: str = 'outputs', weights=None, device: str = 'cpu',
             score_thr: float = 0.3, opacity: float = 0.5, cfg_options=None,
             allow_unsafe: bool = False, batch_size: int = 1, print_result: bool = False,
             show: bool = False) -> list:
    """Predict on the images of ``inputs`` with the model of ``config``; write the pictures.

    Returns:
        list[str]: the paths of the written pictures, in the order of the images.
    """
    from mmplugin_inline.tools_common import can_show, codebase_of, load_config
    from mmplugin_inline.weights import mmengine_checkpoint_loading
    images = list_images(inputs)
    if weights is not None and not osp.isfile(weights):
        raise FileNotFoundError(f'checkpoint not found: {weights}')
    if batch_size < 1:
        raise ValueError(f'--batch-size must be at least 1, got {batch_size}')
    cfg = load_config(config, cfg_options)
    codebase = codebase_of(cfg)
    if codebase == 'mmseg' and batch_size > 1:
        from PIL import Image
        sizes = {}
        for path in images:
            with Image.open(path) as img:
                sizes.setdefault(img.size, path)
        if len(sizes) > 1:  # SegDataPreProcessor asserts one size per batch at test time
            (w1, h1), (w2, h2) = list(sizes)[:2]
            raise ValueError(f'mmseg batches only images of one size, and these differ '
                             f'({w1}x{h1} {sizes[(w1, h1)]}, {w2}x{h2} {sizes[(w2, h2)]}): '
                             'use --batch-size 1')
    if weights is None:
        print(RANDOM_WEIGHTS_WARNING)
    show = can_show(show, f'the pictures are written to {osp.join(out_dir, "vis")}')
    os.makedirs(out_dir, exist_ok=True)
    config_meta = dataset_meta_from_config(cfg, codebase)
    with warnings.catch_warnings():
        if weights is None:  # the inferencers' own warnings say the same, less clearly
            warnings.filterwarnings('ignore', message='.*(randomly initialized|weights is None)')
        with mmengine_checkpoint_loading(allow_unsafe):
            if codebase == 'mmdet':
                from mmdet.apis import DetInferencer
                inferencer = DetInferencer(model=cfg, weights=weights, device=device)
            else:
                from mmseg.apis import MMSegInferencer
                inferencer = MMSegInferencer(model=cfg, weights=weights, device=device,
                                             classes=config_meta['classes'],
                                             palette=config_meta['palette'])
    if weights is None:  # not COCO's / Cityscapes' names by default: the config's dataset
        inferencer.model.dataset_meta = dict(config_meta)  # mmseg draws with the model's
        inferencer.visualizer.dataset_meta = dict(config_meta)
    if codebase == 'mmdet':
        inferencer(images, batch_size=batch_size, out_dir=out_dir, pred_score_thr=score_thr,
                   no_save_pred=True, show=show, print_result=print_result)
    else:  # label maps also in OUT_DIR/pred/
        results = inferencer(images, batch_size=batch_size, out_dir=out_dir, opacity=opacity,
                             show=show)
        if print_result:
            _print_segmentation(images, results, inferencer.model.dataset_meta['classes'])
    written = [osp.join(out_dir, 'vis', osp.basename(image)) for image in images]
    missing = [path for path in written if not osp.isfile(path)]
    if missing:  # the inferencers name the pictures after the images
        raise RuntimeError(f'the {codebase} inferencer wrote no picture {missing[0]}')
    return written


def parse_args(argv=None):
    from mmplugin_inline.tools_common import add_model_options
    parser = argparse.ArgumentParser(description='Predict on images and draw the results')
    parser.add_argument('inputs', help='an image, a folder of images or a quoted glob pattern')
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('--weights', default=None, help='checkpoint (default: random weights)')
    parser.add_argument('--out-dir', default='outputs',
                        help='the pictures go to OUT_DIR/vis/ (default: outputs)')
    parser.add_argument('--pred-score-thr', '--score-thr', dest='score_thr', type=float,
                        default=0.3, help='detection: lowest score drawn')
    parser.add_argument('--batch-size', type=int, default=1, help='images per forward pass')
    parser.add_argument('--print-result', action='store_true', help='print each prediction')
    parser.add_argument('--show', action='store_true',
                        help='show each picture in a window (skipped, with a message, '
                             'without a display)')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='segmentation: opacity of the overlay')
    parser.add_argument('--allow-unsafe', action='store_true',
                        help='allow full unpickling of --weights (runs code from the file; '
                        'only for files you trust)')
    add_model_options(parser, shape=False)
    return parser.parse_args(argv)


def main(argv=None):
    assert_environment()
    from mmplugin_inline.tools_common import fail, load_tool_config
    args = parse_args(argv)
    cfg, _ = load_tool_config(args.config, args.cfg_options)
    try:
        paths = run_demo(args.inputs, cfg, args.out_dir, args.weights, args.device,
                         args.score_thr, args.opacity, allow_unsafe=args.allow_unsafe,
                         batch_size=args.batch_size, print_result=args.print_result,
                         show=args.show)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    for path in paths:
        print(f'wrote {path}')
    return paths

