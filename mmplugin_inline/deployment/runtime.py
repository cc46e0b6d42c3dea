"""Run an ONNX file that ``tools/deployment/pytorch2onnx.py`` wrote for a whole model, with
onnxruntime, numpy and OpenCV only: no torch, no mmdet / mmseg, not even this package.

``tools/deployment/onnx_inference.py`` loads this file by its path (importing
``mmplugin_inline`` would import torch and register the models), so it imports nothing of
the package; it can also be copied next to the ONNX file alone.

What the graph needs before it runs is in the file's metadata (key ``mmplugin_inline``,
written at export from the config): the test pipeline's ``Resize`` (scale and
keep_ratio, as mmcv's ``imrescale`` / ``imresize``: bilinear, sizes rounded half up), the
data preprocessor's BGR -> RGB swap, mean and std, and the padding of the batch to a
multiple of ``size_divisor`` (bottom and right, with ``pad_value`` after normalising).
Detections come back in the resized image's pixels and are divided by the resize's scale
factors. A detector's masks are pasted from its ``mask_probs`` at the original size, with
those boxes, as mmdet's ``predict(rescale=True)`` does (:func:`paste_mask`); a file without
that output, and a segmentor's label map, are cut to the resized image and resized
(nearest) to the original.
"""
import json
import os
import os.path as osp
import sys
from typing import Dict, List, Tuple

import numpy as np

METADATA_KEY = 'mmplugin_inline'  # mmplugin_inline.deployment.metadata.METADATA_KEY
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


class InferenceError(Exception):
    """A bad input or file, reported as one line by :func:`main`."""


def _cv2():
    try:
        import cv2
    except ImportError as exc:
        raise InferenceError(f'{exc}: onnx_inference.py reads and draws images with OpenCV '
                             '(pip install opencv-python-headless)') from None
    return cv2


def load_session(path: str):
    """The onnxruntime CPU session of ``path`` and its preprocessing record (a dict)."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise InferenceError(f'{exc}: onnx_inference.py needs onnxruntime (pip install '
                             'onnxruntime)') from None
    if not osp.isfile(path):
        raise InferenceError(f'ONNX file not found: {path}')
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    meta = session.get_modelmeta().custom_metadata_map
    if METADATA_KEY not in meta:
        raise InferenceError(f'{path} has no {METADATA_KEY!r} metadata: export the whole model '
                            'with tools/deployment/pytorch2onnx.py (not --backbone-only)')
    return session, json.loads(meta[METADATA_KEY])


def rescale_size(hw: Tuple[int, int], scale, keep_ratio: bool) -> Tuple[int, int]:
    """The (H, W) mmcv's Resize gives an image of ``hw`` for ``scale`` (W, H)."""
    h, w = hw
    if not keep_ratio:
        return int(scale[1]), int(scale[0])
    factor = min(max(scale) / max(h, w), min(scale) / min(h, w))
    return int(h * factor + 0.5), int(w * factor + 0.5)


def preprocess(image: np.ndarray, record: Dict) -> Tuple[np.ndarray, Dict]:
    """A BGR ``image`` [h, w, 3] uint8 -> the graph's input [1, 3, H, W] float32 and the
    geometry (``ori_hw``, ``img_hw`` after the resize, ``scale`` (sx, sy))."""
    cv2 = _cv2()
    ori_hw = image.shape[:2]
    resize = record.get('resize')
    if resize:
        img_hw = rescale_size(ori_hw, resize['scale'], resize['keep_ratio'])
        image = cv2.resize(image, (img_hw[1], img_hw[0]), interpolation=cv2.INTER_LINEAR)
    img_hw = image.shape[:2]
    x = image.astype(np.float32)
    if record.get('bgr_to_rgb'):
        x = x[..., ::-1]
    x = (x - np.array(record['mean'], np.float32)) / np.array(record['std'], np.float32)
    div = int(record.get('size_divisor') or 1)
    ph, pw = -(-img_hw[0] // div) * div, -(-img_hw[1] // div) * div
    padded = np.full((ph, pw, 3), record.get('pad_value', 0), np.float32)
    padded[:img_hw[0], :img_hw[1]] = x
    geometry = dict(ori_hw=ori_hw, img_hw=img_hw,
                    scale=(img_hw[1] / ori_hw[1], img_hw[0] / ori_hw[0]))
    return padded.transpose(2, 0, 1)[None].copy(), geometry


def run_graph(session, x: np.ndarray, geometry: Dict) -> Dict[str, np.ndarray]:
    """The graph's outputs by name for the input ``x`` of :func:`preprocess`. A whole
    detector also takes ``img_hw``, the size of the resized image inside the padding
    (boxes are clipped to it, as mmdet clips them to ``img_shape``)."""
    feed = {}
    for arg in session.get_inputs():
        if arg.name == 'img_hw':
            feed[arg.name] = np.array(geometry['img_hw'], np.int64)
        elif not feed:
            feed[arg.name] = x
        else:
            raise InferenceError(f'the graph has an input {arg.name!r} that this runtime does '
                                 'not know (expected the image, and img_hw for a detector)')
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feed)))


def _to_original(plane: np.ndarray, geometry: Dict) -> np.ndarray:
    """A map of the padded input [H, W] cut to the resized image, resized (nearest) to the
    original size."""
    cv2 = _cv2()
    h, w = geometry['img_hw']
    oh, ow = geometry['ori_hw']
    cut = np.ascontiguousarray(plane[:h, :w])
    if (h, w) == (oh, ow):
        return cut
    return cv2.resize(cut, (ow, oh), interpolation=cv2.INTER_NEAREST)


def _bilinear_weights(coords: np.ndarray, size: int) -> np.ndarray:
    """[len(coords), size]: the weights with which bilinear sampling at ``coords`` (pixel
    units of an axis of ``size`` samples, centres at i + 0.5) takes each sample; taps
    outside the axis count as zeros (``grid_sample``'s zero padding)."""
    pos = coords - 0.5
    lo = np.floor(pos)
    frac = (pos - lo).astype(np.float32)
    lo = lo.astype(np.int64)
    weights = np.zeros((len(coords), size), np.float32)
    rows = np.arange(len(coords))
    for index, weight in ((lo, 1 - frac), (lo + 1, frac)):
        inside = (index >= 0) & (index < size)
        weights[rows[inside], index[inside]] += weight[inside]
    return weights


def paste_mask(prob: np.ndarray, box: np.ndarray, hw: Tuple[int, int],
               threshold: float) -> np.ndarray:
    """mmdet's CPU mask paste (``_do_paste_mask`` with ``skip_empty``): the probabilities
    ``prob`` [m, m] over ``box`` (x1, y1, x2, y2), sampled bilinearly at the pixel centres
    of the box's extent plus one pixel, ``>= threshold`` -> a bool mask [H, W].

    ``grid_sample`` on a grid whose x depends on the column only and y on the row only is
    the product of two 1-D interpolations, which is what this computes.
    """
    h, w = hw
    x0, y0, x1, y1 = (float(v) for v in box)
    cx = np.arange(max(int(np.floor(x0)) - 1, 0), min(int(np.ceil(x1)) + 1, w))
    cy = np.arange(max(int(np.floor(y0)) - 1, 0), min(int(np.ceil(y1)) + 1, h))
    out = np.zeros((h, w), bool)
    if not len(cx) or not len(cy):
        return out
    m_h, m_w = prob.shape
    with np.errstate(divide='ignore', invalid='ignore'):
        # the box's [x0, x1] spans the mask's width; a box of zero width maps to its middle
        gx = np.nan_to_num((cx + 0.5 - x0) / (x1 - x0) * m_w, nan=m_w / 2,
                           posinf=m_w / 2, neginf=m_w / 2)
        gy = np.nan_to_num((cy + 0.5 - y0) / (y1 - y0) * m_h, nan=m_h / 2,
                           posinf=m_h / 2, neginf=m_h / 2)
    sampled = _bilinear_weights(gy, m_h) @ prob.astype(np.float32) @ \
        _bilinear_weights(gx, m_w).T
    out[cy[0]:cy[-1] + 1, cx[0]:cx[-1] + 1] = sampled >= threshold
    return out


def rle(mask: np.ndarray) -> Dict:
    """COCO's uncompressed run-length encoding of a bool mask [h, w] (column-major runs,
    starting with a run of zeros)."""
    flat = mask.T.reshape(-1)
    bounds = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts = [0] + counts
    return dict(size=[int(mask.shape[0]), int(mask.shape[1])], counts=counts)


def postprocess_detections(outputs: Dict[str, np.ndarray], geometry: Dict,
                           record: Dict) -> List[Dict]:
    """The graph's ``boxes``, ``scores``, ``labels`` (``masks``, ``mask_probs``) as
    detections in the original image's coordinates: ``bbox`` [x1, y1, x2, y2], ``score``,
    ``label``, ``class`` (the ``record``'s names) and, with masks, ``mask`` (COCO RLE at the
    original size, pasted from ``mask_probs`` at the record's ``mask_thr_binary`` when the
    graph has them)."""
    classes = record.get('classes') or []
    sx, sy = geometry['scale']
    oh, ow = geometry['ori_hw']
    rescaled = outputs['boxes'] / np.array([sx, sy, sx, sy], np.float32)
    boxes = np.clip(rescaled, 0, [ow, oh, ow, oh])
    dets = []
    for i, (box, score, label) in enumerate(zip(boxes, outputs['scores'], outputs['labels'])):
        d = dict(bbox=[round(float(v), 2) for v in box], score=round(float(score), 5),
                 label=int(label), **{'class': classes[label] if label < len(classes)
                                      else str(int(label))})
        mask = None
        if 'mask_probs' in outputs:
            mask = paste_mask(outputs['mask_probs'][i], rescaled[i], (oh, ow),
                              record['mask_thr_binary'])
        elif 'masks' in outputs:  # a file exported before mask_probs
            mask = _to_original(outputs['masks'][i].astype(np.uint8), geometry).astype(bool)
        if mask is not None:
            d.update(mask=rle(mask), mask_area=int(mask.sum()))
        dets.append(d)
    return dets


def palette(n: int) -> np.ndarray:
    """``n`` distinct-enough BGR colours (seeded, the same in every run)."""
    return np.random.RandomState(42).randint(0, 256, size=(max(n, 1), 3)).astype(np.uint8)


def draw_detections(image: np.ndarray, dets: List[Dict], masks: List[np.ndarray],
                    colours: np.ndarray) -> np.ndarray:
    """``image`` (BGR) with each detection's mask blended in and its box and class drawn."""
    cv2 = _cv2()
    out = image.copy()
    for d, mask in zip(dets, masks):
        colour = colours[d['label'] % len(colours)]
        if mask is not None:
            out[mask] = (0.5 * out[mask] + 0.5 * colour).astype(np.uint8)
        x1, y1, x2, y2 = (int(round(v)) for v in d['bbox'])
        c = tuple(int(v) for v in colour)
        cv2.rectangle(out, (x1, y1), (x2, y2), c, 2)
        cv2.putText(out, f'{d["class"]} {d["score"]:.2f}', (x1, max(y1 - 3, 10)),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.4, c, 1, cv2.LINE_AA)
    return out


def run_image(session, record: Dict, path: str, out_dir: str, score_thr: float) -> Dict:
    """Run one image; write ``NAME.png`` (drawn) and ``NAME.json`` into ``out_dir``."""
    cv2 = _cv2()
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise InferenceError(f'cannot read the image {path}')
    x, geometry = preprocess(image, record)
    outputs = run_graph(session, x, geometry)
    stem = osp.splitext(osp.basename(path))[0]
    classes = record.get('classes') or []
    result = dict(image=path, height=int(geometry['ori_hw'][0]),
                  width=int(geometry['ori_hw'][1]), input_shape=list(x.shape))
    if record['task'] == 'detection':
        dets = [d for d in postprocess_detections(outputs, geometry, record)
                if d['score'] >= score_thr]
        masks = [_decode_rle(d['mask']) if 'mask' in d else None for d in dets]
        drawn = draw_detections(image, dets, masks, palette(len(classes)))
        result['detections'] = dets
    else:
        if 'labels' not in outputs:
            raise InferenceError('this segmentor was exported without --with-argmax (logits); '
                                'onnx_inference.py needs the label map: export again with '
                                '--with-argmax')
        labels = _to_original(outputs['labels'][0].astype(np.int32), geometry)
        colours = palette(len(classes))
        drawn = (0.5 * image + 0.5 * colours[labels % len(colours)]).astype(np.uint8)
        cv2.imwrite(osp.join(out_dir, f'{stem}_labels.png'), labels.astype(np.uint16))
        ids, counts = np.unique(labels, return_counts=True)
        result['label_map'] = f'{stem}_labels.png'
        result['classes'] = [dict(label=int(i), share=round(float(c) / labels.size, 6),
                                  **{'class': classes[i] if i < len(classes) else str(int(i))})
                             for i, c in zip(ids, counts)]
    cv2.imwrite(osp.join(out_dir, f'{stem}.png'), drawn)
    with open(osp.join(out_dir, f'{stem}.json'), 'w') as f:
        json.dump(result, f, indent=1)
    return result


def _decode_rle(code: Dict) -> np.ndarray:
    """The bool mask [h, w] of :func:`rle`'s encoding."""
    h, w = code['size']
    values = np.zeros(len(code['counts']), np.uint8)
    values[1::2] = 1
    return np.repeat(values, code['counts']).reshape(w, h).T.astype(bool)


def image_files(path: str) -> List[str]:
    """``path`` itself, or the images of the folder ``path`` (sorted)."""
    if osp.isfile(path):
        return [path]
    if osp.isdir(path):
        files = sorted(osp.join(path, f) for f in os.listdir(path)
                       if f.lower().endswith(IMAGE_EXTENSIONS))
        if files:
            return files
        raise InferenceError(f'no images ({", ".join(IMAGE_EXTENSIONS)}) in {path}')
    raise InferenceError(f'image or folder not found: {path}')


def parse_args(argv=None):
    import argparse
    parser = argparse.ArgumentParser(
        description='Run an ONNX whole model of tools/deployment/pytorch2onnx.py on images '
                    'with onnxruntime (no torch / mmdet / mmseg needed)')
    parser.add_argument('model', help='the .onnx file')
    parser.add_argument('images', help='an image file or a folder of images')
    parser.add_argument('--out-dir', required=True,
                        help='where to write NAME.png (drawn) and NAME.json per image')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections below this score are left out (default 0.3)')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """The command line of ``tools/deployment/onnx_inference.py``."""
    args = parse_args(argv)
    try:
        session, record = load_session(args.model)
        files = image_files(args.images)
        os.makedirs(args.out_dir, exist_ok=True)
        for path in files:
            result = run_image(session, record, path, args.out_dir, args.score_thr)
            what = (f'{len(result["detections"])} detections' if 'detections' in result
                    else f'{len(result["classes"])} classes')
            print(f'{path}: {what} -> {osp.join(args.out_dir, osp.basename(path))}')
    except InferenceError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
