"""Generate a deterministic synthetic dataset of coloured shapes.

One set of images, annotated twice:

* instance segmentation in COCO format (polygon or RLE masks), for mmdet;
* semantic label maps in ADE20K's layout, for mmseg's ``ADE20KDataset``.

Layout under ``OUT``::

    images/training/000000.jpg ...          the images (shared by both formats)
    images/validation/000000.jpg ...
    annotations/training/000000.png ...     label maps: 0 = background, k = class k
    annotations/validation/000000.png ...   (load with reduce_zero_label=True)
    annotations/instances_training.json     COCO instances, category ids 1..K
    annotations/instances_validation.json
    dataset_info.json                       classes, palette and the options used

The label maps follow ADE20K's convention: 0 is background, which
``reduce_zero_label=True`` turns into the ignore index 255, and the shape classes
are 1..K (0..K-1 after the reduction). mmseg's ``ADE20KDataset`` fixes its 150 classes,
so a config reads these folders with ``type='BaseSegDataset', img_suffix='.jpg',
seg_map_suffix='.png', reduce_zero_label=True`` and ``metainfo`` from
``dataset_info.json`` -- the same layout and convention. Shapes never overlap, so an instance mask,
its polygon and the label map agree pixel for pixel.

The output depends only on the options: every image is drawn from its own random
generator seeded by ``(seed, split, index)``, so the first images of a larger set
are the images of a smaller one. Example (the ``make demo`` set)::

    python tools/misc/make_shapes_dataset.py data/shapes --train 800 --val 100 \\
        --min-size 192 --max-size 320 --min-shapes 1 --max-shapes 4 \\
        --classes circle square triangle --noisy 0.5
"""
import argparse
import json
import os
import os.path as osp
import re
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np

SPLITS = {'train': 'training', 'val': 'validation'}
SHAPES = ('circle', 'square', 'triangle', 'rectangle', 'ellipse', 'hexagon', 'star')
# fixed display colours for the label maps / visualizers (one per supported shape)
PALETTE = [(220, 20, 60), (0, 130, 200), (60, 180, 75), (255, 165, 0), (145, 30, 180),
           (70, 240, 240), (240, 50, 230)]
CIRCLE_VERTICES = 48


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('out', help='output directory (created if needed; images and label maps '
                        'of an earlier run there are replaced)')
    parser.add_argument('--train', type=int, default=16, help='number of training images')
    parser.add_argument('--val', type=int, default=8, help='number of validation images')
    parser.add_argument('--min-size', type=int, default=96,
                        help='smallest image side (each side is drawn independently)')
    parser.add_argument('--max-size', type=int, default=160, help='largest image side')
    parser.add_argument('--min-shapes', type=int, default=1, help='fewest shapes per image')
    parser.add_argument('--max-shapes', type=int, default=4, help='most shapes per image')
    parser.add_argument('--classes', nargs='+', default=['circle', 'square', 'triangle'],
                        choices=SHAPES, metavar='SHAPE',
                        help=f'shape classes, in category order; from {", ".join(SHAPES)}')
    parser.add_argument('--noisy', type=float, default=0.5,
                        help='fraction of images with a noisy, textured background '
                             '(the others have a plain one)')
    parser.add_argument('--mask-format', choices=['polygon', 'rle'], default='polygon',
                        help='how COCO instance masks are written')
    parser.add_argument('--formats', nargs='+', choices=['coco', 'ade'], default=['coco', 'ade'],
                        help='annotation formats to write')
    parser.add_argument('--seed', type=int, default=0, help='random seed')
    args = parser.parse_args(argv)
    if args.min_size < 32 or args.max_size < args.min_size:
        parser.error('need 32 <= --min-size <= --max-size')
    if not 1 <= args.min_shapes <= args.max_shapes:
        parser.error('need 1 <= --min-shapes <= --max-shapes')
    if not 0.0 <= args.noisy <= 1.0:
        parser.error('--noisy is a fraction in [0, 1]')
    if len(set(args.classes)) != len(args.classes):
        parser.error('--classes must not repeat a shape')
    if args.train < 0 or args.val < 0 or args.train + args.val == 0:
        parser.error('need at least one image (--train / --val)')
    return args


def shape_polygon(kind: str, center: Tuple[float, float], radius: float, angle: float,
                  aspect: float) -> np.ndarray:
    """Vertices ([V, 2] float, x y) of a shape of ``kind`` inscribed in ``radius``."""
    if kind in ('circle', 'ellipse'):
        t = np.linspace(0, 2 * np.pi, CIRCLE_VERTICES, endpoint=False)
        ry = radius * (aspect if kind == 'ellipse' else 1.0)
        pts = np.stack([radius * np.cos(t), ry * np.sin(t)], axis=1)
    elif kind in ('square', 'rectangle'):
        half_h = radius * (aspect if kind == 'rectangle' else 1.0) / np.sqrt(2)
        half_w = radius / np.sqrt(2)
        pts = np.array([[-half_w, -half_h], [half_w, -half_h], [half_w, half_h],
                        [-half_w, half_h]])
    elif kind == 'triangle':
        t = np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        pts = np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)
    elif kind == 'hexagon':
        t = np.arange(6) * np.pi / 3
        pts = np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)
    elif kind == 'star':
        t = np.pi / 2 + np.arange(10) * np.pi / 5
        r = np.where(np.arange(10) % 2 == 0, radius, radius * 0.45)
        pts = np.stack([r * np.cos(t), r * np.sin(t)], axis=1)
    else:
        raise ValueError(f'unknown shape {kind!r}; choose from {SHAPES}')
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return pts @ rot.T + np.asarray(center)


def rasterize(polygon: np.ndarray, hw: Tuple[int, int]) -> np.ndarray:
    """Boolean mask [H, W] of a polygon, rasterized exactly as COCO tools decode it."""
    from pycocotools import mask as mask_utils
    rles = mask_utils.frPyObjects([polygon.reshape(-1).tolist()], hw[0], hw[1])
    return mask_utils.decode(mask_utils.merge(rles)).astype(bool)


def background(rng: np.random.Generator, hw: Tuple[int, int], noisy: bool) -> np.ndarray:
    """A plain colour, or a colour gradient with blobs and pixel noise (float32 [H, W, 3])."""
    h, w = hw
    base = rng.uniform(40, 215, size=3)
    img = np.broadcast_to(base, (h, w, 3)).astype(np.float32).copy()
    if not noisy:
        return img
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    direction = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(direction) * xx / w + np.sin(direction) * yy / h)[..., None]
    img += ramp * rng.uniform(-60, 60, size=3)
    for _ in range(int(rng.integers(3, 9))):  # soft clutter blobs
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        sigma = rng.uniform(0.05, 0.2) * min(h, w)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma ** 2))[..., None]
        img += blob * rng.uniform(-70, 70, size=3)
    return img


def pick_colour(rng: np.random.Generator, bg_mean: np.ndarray) -> np.ndarray:
    """A colour clearly different from the background (L1 distance >= 150)."""
    for _ in range(100):
        colour = rng.uniform(0, 255, size=3)
        if np.abs(colour - bg_mean).sum() >= 150:
            return colour
    return 255.0 - bg_mean


def draw_image(rng: np.random.Generator, hw: Tuple[int, int], classes: Sequence[str],
               num_shapes: int, noisy: bool):
    """Draw one image.

    Returns:
        tuple: ``(image uint8 [H, W, 3] BGR, instances)``; each instance is a dict with
        ``label`` (0-based class), ``polygon`` ([V, 2]) and ``mask`` ([H, W] bool).
    """
    h, w = hw
    img = background(rng, hw, noisy)
    occupied = np.zeros(hw, bool)
    instances = []
    for _ in range(num_shapes):
        for _attempt in range(60):
            label = int(rng.integers(len(classes)))
            radius = rng.uniform(0.12, 0.3) * min(h, w)
            center = (rng.uniform(radius, w - radius), rng.uniform(radius, h - radius))
            polygon = np.round(shape_polygon(classes[label], center, radius,
                                             rng.uniform(0, 2 * np.pi),
                                             rng.uniform(0.45, 0.75)), 2)  # as written
            mask = rasterize(polygon, hw)
            grown = cv2.dilate(mask.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
            if mask.sum() >= 16 and not (grown & occupied).any():
                break
        else:
            continue  # no room left for another shape
        occupied |= mask
        img[mask] = pick_colour(rng, img[mask].mean(axis=0))
        instances.append(dict(label=label, polygon=polygon, mask=mask))
    if noisy:
        img += rng.normal(0, rng.uniform(8, 25), size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), instances


def coco_segmentation(instance: Dict, hw: Tuple[int, int], mask_format: str):
    """The COCO ``segmentation`` field of an instance: a polygon list or an RLE dict."""
    if mask_format == 'polygon':
        return [[float(v) for v in instance['polygon'].reshape(-1)]]
    from pycocotools import mask as mask_utils
    rle = mask_utils.encode(np.asfortranarray(instance['mask'].astype(np.uint8)))
    return dict(size=[int(hw[0]), int(hw[1])], counts=rle['counts'].decode('ascii'))


def mask_bbox(mask: np.ndarray) -> List[float]:
    """COCO box [x, y, w, h] enclosing a mask's pixels."""
    ys, xs = np.nonzero(mask)
    x0, y0 = int(xs.min()), int(ys.min())
    return [float(x0), float(y0), float(xs.max() - x0 + 1), float(ys.max() - y0 + 1)]


def remove_earlier_output(directory: str, suffix: str) -> None:
    """Delete files an earlier run wrote (``000123.jpg``): a smaller set must not inherit them."""
    if not osp.isdir(directory):
        return
    for name in os.listdir(directory):
        if re.fullmatch(r'\d{6}' + re.escape(suffix), name):
            os.remove(osp.join(directory, name))


def generate_split(args, split: str, count: int) -> Dict:
    """Write the images (and label maps) of one split; return its COCO dict."""
    split_dir = SPLITS[split]
    img_dir = osp.join(args.out, 'images', split_dir)
    seg_dir = osp.join(args.out, 'annotations', split_dir)
    remove_earlier_output(img_dir, '.jpg')
    remove_earlier_output(seg_dir, '.png')
    os.makedirs(img_dir, exist_ok=True)
    if 'ade' in args.formats:
        os.makedirs(seg_dir, exist_ok=True)
    coco = dict(info=dict(description='synthetic coloured shapes', version='1.0',
                          contributor='tools/misc/make_shapes_dataset.py'),
                licenses=[], images=[], annotations=[],
                categories=[dict(id=i + 1, name=name, supercategory='shape')
                            for i, name in enumerate(args.classes)])
    split_id = list(SPLITS).index(split)
    for index in range(count):
        rng = np.random.default_rng([args.seed, split_id, index])
        hw = (int(rng.integers(args.min_size, args.max_size + 1)),
              int(rng.integers(args.min_size, args.max_size + 1)))
        num_shapes = int(rng.integers(args.min_shapes, args.max_shapes + 1))
        noisy = bool(rng.random() < args.noisy)
        img, instances = draw_image(rng, hw, args.classes, num_shapes, noisy)
        name = f'{index:06d}'
        cv2.imwrite(osp.join(img_dir, name + '.jpg'), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        if 'ade' in args.formats:
            label_map = np.zeros(hw, np.uint8)
            for inst in instances:
                label_map[inst['mask']] = inst['label'] + 1
            cv2.imwrite(osp.join(seg_dir, name + '.png'), label_map)
        image_id = index + 1
        coco['images'].append(dict(id=image_id, file_name=name + '.jpg', height=hw[0],
                                   width=hw[1]))
        for inst in instances:
            coco['annotations'].append(dict(
                id=len(coco['annotations']) + 1, image_id=image_id,
                category_id=inst['label'] + 1,
                segmentation=coco_segmentation(inst, hw, args.mask_format),
                area=float(inst['mask'].sum()), bbox=mask_bbox(inst['mask']), iscrowd=0))
    return coco


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    counts = {'train': args.train, 'val': args.val}
    totals = {}
    for split, count in counts.items():
        coco = generate_split(args, split, count)
        totals[split] = (len(coco['images']), len(coco['annotations']))
        if 'coco' in args.formats:
            path = osp.join(args.out, 'annotations', f'instances_{SPLITS[split]}.json')
            os.makedirs(osp.dirname(path), exist_ok=True)
            with open(path, 'w') as f:
                json.dump(coco, f)
    info = dict(classes=list(args.classes),
                palette=[list(PALETTE[SHAPES.index(c)]) for c in args.classes],
                label_map='0 = background (ignored with reduce_zero_label=True), '
                          'k = classes[k - 1]',
                options={k: v for k, v in vars(args).items() if k != 'out'})
    with open(osp.join(args.out, 'dataset_info.json'), 'w') as f:
        json.dump(info, f, indent=2)
    for split, (n_img, n_ann) in totals.items():
        img_dir = osp.join(args.out, 'images', SPLITS[split])
        print(f'{split}: {n_img} images, {n_ann} shapes -> {img_dir}')
    return 0

