"""The preprocessing record of an exported whole model: what a runtime without mmdet /
mmseg (:mod:`.runtime`) needs to feed the graph and read its outputs, kept in the ONNX
file's ``metadata_props``."""
from typing import Sequence

#: the key of the preprocessing record in the ONNX file's metadata_props
METADATA_KEY = 'mmplugin_inline'


def deployment_metadata(cfg, codebase: str, task: str, outputs: Sequence[str]) -> dict:
    """What a runtime without mmdet / mmseg needs to feed the graph and read its outputs
    (``tools/deployment/onnx_inference.py``), as ``{METADATA_KEY: JSON}``: the task and
    output names, the data preprocessor's mean, std, BGR -> RGB swap, size divisor and pad
    value, the test pipeline's ``Resize`` (scale, keep_ratio), the class names and, for a
    detector with ``mask_probs``, the mask head's ``mask_thr_binary``.

    Raises ValueError when the test pipeline resizes in a way this record cannot say.
    """
    import json
    pre = cfg.model.get('data_preprocessor', {})
    resize = None
    for step in cfg.test_dataloader.dataset.pipeline:
        kind = step['type'].split('.')[-1]
        if kind == 'Resize':
            scale = step.get('scale')
            if scale is None or step.get('scale_factor') is not None:
                raise ValueError(f'test pipeline Resize without a fixed scale: {step}')
            resize = dict(scale=list(scale), keep_ratio=bool(step.get('keep_ratio', False)))
        elif 'Resize' in kind or 'Crop' in kind or kind in ('Pad', 'MultiScaleFlipAug',
                                                            'TestTimeAug'):
            raise ValueError(f'the test pipeline step {kind} cannot be recorded for '
                             'onnx_inference.py (supported: Resize with a fixed scale)')
    if codebase == 'mmseg':  # SegDataPreProcessor pads test images only by its test_cfg
        test_pad = pre.get('test_cfg') or {}
        if test_pad.get('size'):
            raise ValueError(f'data_preprocessor.test_cfg.size {test_pad["size"]} (padding '
                             'to a fixed size) is not recorded')
        divisor, pad_value = test_pad.get('size_divisor') or 1, pre.get('pad_val', 0)
    else:
        divisor, pad_value = pre.get('pad_size_divisor') or 1, pre.get('pad_value', 0)
    record = dict(
        task=task, outputs=list(outputs), codebase=codebase,
        mean=[float(v) for v in pre.get('mean', [0, 0, 0])],
        std=[float(v) for v in pre.get('std', [1, 1, 1])],
        bgr_to_rgb=bool(pre.get('bgr_to_rgb', False)),
        size_divisor=int(divisor), pad_value=float(pad_value),
        resize=resize, classes=list(_class_names(cfg, codebase)))
    if 'mask_probs' in outputs:  # the runtime pastes them at the original size
        record['mask_thr_binary'] = float(cfg.model.test_cfg.rcnn.mask_thr_binary)
    return {METADATA_KEY: json.dumps(record)}


def _class_names(cfg, codebase: str) -> Sequence[str]:
    """The test dataset's class names (its metainfo, else its class's METAINFO)."""
    import importlib
    dataset = cfg.test_dataloader.dataset
    meta = dataset.get('metainfo') or {}
    if meta.get('classes'):
        return meta['classes']
    registry = importlib.import_module(f'{codebase}.registry').DATASETS
    cls = registry.get(dataset['type'])
    return getattr(cls, 'METAINFO', {}).get('classes', ()) if cls else ()
