"""Verification of an exported ONNX file with onnxruntime (CPU) against PyTorch: a
backbone or segmentor's outputs (:func:`verify_onnx`, the tool's ``--verify``; batch 1 and
2 at each size, :func:`check_rows` names the outputs of another shape or above the
tolerance), a whole detector's detections (:func:`verify_detector`) and a segmentor's
label map (:func:`verify_segmentor_labels`) against the model's ``predict``."""
from typing import List, Optional, Sequence, Tuple

from .onnx import EXAMPLE_BATCH, INPUT_NAME


def default_verify_shapes(shape: Tuple[int, int]) -> List[Tuple[int, int]]:
    """Two sizes other than ``shape``, neither side a multiple of 32 (nor even)."""
    h, w = shape

    def odd(n):
        n = max(n, 33)
        return n + 1 if n % 2 == 0 else n
    return [(odd(h - h // 4), odd(w + w // 8)), (odd(h + h // 3), odd(w - w // 5))]


def verify_onnx(module, path: str, shapes: Sequence[Tuple[int, int]],
                batches: Sequence[int] = (1, EXAMPLE_BATCH), in_channels: int = 3,
                seed: int = 0) -> List[dict]:
    """Run ``path`` with onnxruntime (CPU) and ``module`` in PyTorch on the same random
    inputs; one row per batch size, size and output: ``batch, hw, output, shape
    (PyTorch), onnx_shape, max_abs_err`` (None when the shapes differ)."""
    import numpy as np
    import onnxruntime as ort
    import torch
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    name = session.get_inputs()[0].name
    gen = torch.Generator().manual_seed(seed)
    rows = []
    module.eval()
    for h, w in shapes:
        for b in batches:
            x = torch.randn(b, in_channels, h, w, generator=gen)
            with torch.no_grad():
                ref = module(x)
            ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
            got = session.run(None, {name: x.numpy()})
            if len(got) != len(ref):
                raise ValueError(f'{path} has {len(got)} outputs, PyTorch gives {len(ref)}')
            for i, (r, o) in enumerate(zip(ref, got)):
                r = r.numpy()
                err = float(np.abs(r - o).max()) if r.shape == o.shape else None
                rows.append(dict(batch=b, hw=(h, w), output=i, shape=tuple(r.shape),
                                 onnx_shape=tuple(o.shape), max_abs_err=err))
    return rows


def check_rows(rows: List[dict], tolerance: float) -> Optional[str]:
    """A failure message for rows of another shape or above ``tolerance``, else None."""
    bad = []
    for r in rows:
        where = f'batch {r["batch"]}, {r["hw"][0]}x{r["hw"][1]}, output {r["output"]}'
        if r['max_abs_err'] is None:
            bad.append(f'{where}: ONNX shape {r["onnx_shape"]}, PyTorch {r["shape"]}')
        elif not r['max_abs_err'] <= tolerance:
            bad.append(f'{where}: max abs error {r["max_abs_err"]:.3g} > {tolerance:g}')
    if not bad:
        return None
    return ('ONNX verification failed (onnxruntime vs PyTorch):\n  ' + '\n  '.join(bad) +
            '\nThe exported graph does not compute what the model computes at these sizes.')


def format_rows(rows: List[dict]) -> str:
    lines = ['| batch | H x W | output | shape | max abs error |', '|---|---|---|---|---|']
    for r in rows:
        err = 'shape differs' if r['max_abs_err'] is None else f'{r["max_abs_err"]:.2e}'
        lines.append(f'| {r["batch"]} | {r["hw"][0]}x{r["hw"][1]} | {r["output"]} | '
                     f'{"x".join(map(str, r["shape"]))} | {err} |')
    return '\n'.join(lines)


def onnx_session(path: str):
    """An onnxruntime CPU session of ``path``."""
    import onnxruntime as ort
    return ort.InferenceSession(path, providers=['CPUExecutionProvider'])


def random_inputs(shapes: Sequence[Tuple[int, int]], seed: int = 0, in_channels: int = 3):
    """One seeded normal [1, C, H, W] tensor per size (what normalised images look like)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, in_channels, h, w, generator=gen) for h, w in shapes]


def image_inputs(model, cfg, paths: Sequence[str]):
    """The config's test pipeline and the model's data preprocessor applied to each image:
    per file, the normalised, padded [1, 3, H, W] tensor (what ``tools/test.py`` feeds)
    and the (h, w) of the resized image inside it (``img_shape``)."""
    import torch
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    steps = [dict(step) for step in cfg.test_dataloader.dataset.pipeline
             if 'Annotations' not in step['type']]
    pipeline = Compose(steps)
    out = []
    with torch.no_grad():
        for path in paths:
            data = pipeline(dict(img_path=path, img_id=0))
            batch = model.data_preprocessor(
                dict(inputs=[data['inputs']], data_samples=[data['data_samples']]), False)
            out.append((batch['inputs'], tuple(batch['data_samples'][0].img_shape)))
    return out


def _image_and_size(item):
    """An item of :func:`random_inputs` (a tensor: the image is the whole input) or of
    :func:`image_inputs` (the tensor and the size of the image inside its padding)."""
    return item if isinstance(item, tuple) else (item, tuple(item.shape[2:]))


def verify_detector(model, path: str, inputs, iou: float = 0.99,
                    score_tol: float = 1e-3) -> List[dict]:
    """onnxruntime on ``path`` against mmdet's ``predict(rescale=False)`` on each item of
    ``inputs`` (a tensor, seen as the image; or a padded tensor and its image's size, as
    :func:`image_inputs` gives); one row per input with the counts of
    :func:`~.detector.match_detections` and, with masks, the share of equal mask pixels
    over the matched detections."""
    import numpy as np

    from .detector import TwoStageDetectorGraph
    from .detector_check import match_detections, torch_detections
    session = onnx_session(path)
    names = [o.name for o in session.get_outputs()]
    rows = []
    for item in inputs:
        x, img_hw = _image_and_size(item)
        ref = torch_detections(model, x, img_hw)
        feed = dict(zip(TwoStageDetectorGraph.input_names,
                        (x.numpy(), np.array(img_hw, np.int64))))
        got = dict(zip(names, session.run(None, feed)))
        row = match_detections(ref, got, iou, score_tol)
        row['hw'] = tuple(x.shape[2:])
        pairs = row.pop('pairs')
        if 'masks' in got and 'masks' in ref and pairs:
            equal = [np.mean(ref['masks'][i] == got['masks'][j]) for i, j in pairs]
            row['mask_equal'] = float(np.mean(equal))
        rows.append(row)
    return rows


def verify_segmentor_labels(model, path: str, inputs) -> List[dict]:
    """onnxruntime on ``path`` (``--with-argmax``: labels [B, H, W]) against mmseg's
    ``predict`` on each tensor of ``inputs`` (seen as the image); one row per input with
    the share of equal labels."""
    import numpy as np
    import torch
    from mmseg.structures import SegDataSample
    session = onnx_session(path)
    rows = []
    for item in inputs:
        x, _ = _image_and_size(item)  # the whole input seen as the image, padding included
        h, w = x.shape[2:]
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                             pad_shape=(h, w), padding_size=[0, 0, 0, 0]))
        with torch.no_grad():
            ref = model.predict(x, [sample])[0].pred_sem_seg.data[0].numpy()
        out = session.run(None, {INPUT_NAME: x.numpy()})[0]          # [1, H, W]
        equal = float(np.mean(ref == out[0])) if (1,) + ref.shape == out.shape else None
        rows.append(dict(hw=(h, w), shape=ref.shape, onnx_shape=out.shape, equal=equal))
    return rows
