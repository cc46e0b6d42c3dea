"""Whole detectors and segmentors of a config, and training samples for them (mmdet's /
mmseg's data samples)."""
import numpy as np
import torch


def build_codebase_model(model_cfg, scope: str):
    """``model_cfg`` built in its codebase (``scope``: 'mmdet' or 'mmseg'), initialised,
    SyncBN reverted as mmengine's runner does without distribution."""
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import DefaultScope
    if scope == 'mmdet':
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    else:
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(model_cfg)
    model.init_weights()
    return revert_sync_batchnorm(model)


def det_sample(hw, num_classes, seed):
    """An mmdet training sample of size ``hw``: two boxes with their masks and labels."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    rng = np.random.default_rng(seed)
    h, w = hw
    boxes, masks = [], []
    for _ in range(2):
        x0, y0 = rng.integers(0, w // 2), rng.integers(0, h // 2)
        x1, y1 = x0 + rng.integers(8, w // 2), y0 + rng.integers(8, h // 2)
        boxes.append([x0, y0, x1, y1])
        mask = np.zeros((h, w), np.uint8)
        mask[y0:y1, x0:x1] = 1
        masks.append(mask)
    sample = DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw,
                                         scale_factor=(1.0, 1.0), batch_input_shape=hw))
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor(boxes, dtype=torch.float32),
        labels=torch.tensor(rng.integers(0, num_classes, 2)),
        masks=BitmapMasks(np.stack(masks), h, w))
    return sample


def seg_sample(hw, num_classes, seed):
    """An mmseg training sample of size ``hw``: random labels below ``num_classes``."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    rng = np.random.default_rng(seed)
    sample = SegDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw,
                                         scale_factor=(1.0, 1.0)))
    sample.gt_sem_seg = PixelData(
        data=torch.from_numpy(rng.integers(0, num_classes, (1, *hw))).long())
    return sample
