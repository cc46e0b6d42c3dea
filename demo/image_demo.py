"""Predict on one image and draw it: boxes and masks (mmdet) or a segmentation overlay (mmseg).

Usage::

    python demo/image_demo.py IMAGE CONFIG [--weights CKPT] --out-dir DIR
        [--device cpu|cuda] [--score-thr 0.3] [--opacity 0.5] [--allow-unsafe]
        [--cfg-options KEY=VALUE ...]

Which codebase the config belongs to is its ``default_scope``, else the codebase
whose registry has the model type (``mmplugin_inline.utils.tool_setup``); the picture
is drawn by mmdet's ``DetInferencer`` (``DetLocalVisualizer``) or mmseg's
``MMSegInferencer`` (``SegLocalVisualizer``) and written to ``DIR/vis/<image name>``
(mmseg also writes the predicted label map to ``DIR/pred/``).
Without ``--weights`` the model is randomly initialised (a warning says so): useful
to check that a config runs, not to look at. Class names and colours come from the
checkpoint's meta data, else from the config's test dataset.

Checkpoints written by ``tools/train.py`` load with ``torch.load(weights_only=True)``
and the allow-list of what mmengine saves; a file that needs full unpickling is
refused unless ``--allow-unsafe`` is given (only for files you trust).
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


def run_demo(image: str, config, out_dir: str, weights=None, device: str = 'cpu',
             score_thr: float = 0.3, opacity: float = 0.5, cfg_options=None,
             allow_unsafe: bool = False) -> str:
    """Predict on ``image`` with the model of ``config`` and write the picture.

    Returns:
        str: the path of the written picture.
    """
    from mmplugin_inline.loading import mmengine_checkpoint_loading
    from mmplugin_inline.utils.tool_setup import codebase_of, load_config
    if not osp.isfile(image):
        raise FileNotFoundError(f'image not found: {image}')
    if weights is not None and not osp.isfile(weights):
        raise FileNotFoundError(f'checkpoint not found: {weights}')
    cfg = load_config(config, cfg_options)
    codebase = codebase_of(cfg)
    if weights is None:
        print(RANDOM_WEIGHTS_WARNING)
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
    if codebase == 'mmdet':
        if weights is None:  # not COCO's names by default: the config's dataset
            inferencer.model.dataset_meta = dict(config_meta)
            inferencer.visualizer.dataset_meta = dict(config_meta)
        inferencer(image, out_dir=out_dir, pred_score_thr=score_thr, no_save_pred=True)
    else:
        inferencer(image, out_dir=out_dir, opacity=opacity)  # label map also in DIR/pred/
    written = osp.join(out_dir, 'vis', osp.basename(image))
    if not osp.isfile(written):  # the inferencers name files after the image
        found = sorted(glob.glob(osp.join(out_dir, 'vis', '*')), key=osp.getmtime)
        if not found:
            raise RuntimeError(f'the {codebase} inferencer wrote no picture under {out_dir}/vis')
        written = found[-1]
    return written


def parse_args(argv=None):
    from mmplugin_inline.utils.tool_setup import add_model_options
    parser = argparse.ArgumentParser(description='Predict on one image and draw the result')
    parser.add_argument('image', help='image file')
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('--weights', default=None, help='checkpoint (default: random weights)')
    parser.add_argument('--out-dir', required=True, help='the picture goes to OUT_DIR/vis/')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detection: lowest score drawn')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='segmentation: opacity of the overlay')
    parser.add_argument('--allow-unsafe', action='store_true',
                        help='allow full unpickling of --weights (runs code from the file; '
                        'only for files you trust)')
    add_model_options(parser, shape=False)
    return parser.parse_args(argv)


def main(argv=None):
    assert_environment()
    from mmplugin_inline.utils.tool_setup import load_tool_config
    args = parse_args(argv)
    cfg, _ = load_tool_config(args.config, args.cfg_options)
    path = run_demo(args.image, cfg, args.out_dir, args.weights, args.device, args.score_thr,
                    args.opacity, allow_unsafe=args.allow_unsafe)
    print(f'wrote {path}')
    return path


if __name__ == '__main__':
    main()
