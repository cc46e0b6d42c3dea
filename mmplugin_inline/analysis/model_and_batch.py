"""Build the model of any mmdet / mmseg config and a dummy batch for it.

Shared by ``tools/analysis_tools/get_flops.py`` and ``benchmark.py``: the config is
loaded and its codebase ('mmdet' or 'mmseg') told by
:mod:`mmplugin_inline.tools_common`; the model is built through that codebase's
registry with random weights (``init_weights`` is not called, so no checkpoint is
read); the dummy batch goes through the model's own data preprocessor, so the
network sees what it would see at inference (normalised, padded to the size divisor).
"""
import importlib
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.config import Config

from ..tools_common import CODEBASES, codebase_of

#: input H x W when a tool is given none: mmdet's 1333 x 800 test scale, ADE20K's crop
DEFAULT_SHAPES = {'mmdet': (800, 1333), 'mmseg': (512, 512)}


def build_model(cfg: Config, device: str = 'cpu', drop_auxiliary_head: bool = True) -> nn.Module:
    """The config's model in eval mode on ``device``, randomly initialised.

    SyncBN is reverted to BN (one process). mmseg's ``auxiliary_head`` is a training-only
    head; with ``drop_auxiliary_head`` it is removed (as mmseg's own get_flops does), so
    parameter counts describe the inference network.
    """
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    codebase = codebase_of(cfg)
    init_default_scope(codebase)
    registry = importlib.import_module(f'{codebase}.registry').MODELS
    model = registry.build(cfg.model)
    if drop_auxiliary_head and getattr(model, 'auxiliary_head', None) is not None:
        model.auxiliary_head = None
    model = revert_sync_batchnorm(model)
    return model.to(device).eval()


def config_model_and_shape(config, shape: Optional[Sequence[int]] = None, device: str = 'cpu',
                           cfg_options: Optional[dict] = None, model: Optional[nn.Module] = None):
    """What a tool measuring a config needs: ``(cfg, codebase, (H, W), model)``.

    ``config`` is a path or a loaded :class:`Config`; ``shape`` as :func:`parse_shape`
    reads it; ``model`` is built (:func:`build_model`) unless one is given. The model is
    returned in eval mode.
    """
    from ..tools_common import load_config
    cfg = load_config(config, cfg_options)
    codebase = codebase_of(cfg)
    shape = parse_shape(shape, codebase)
    if model is None:
        model = build_model(cfg, device)
    return cfg, codebase, shape, model.eval()


def parse_shape(shape: Optional[Sequence[int]], codebase: str = 'mmdet') -> Tuple[int, int]:
    """``[S]`` -> (S, S); ``[H, W]`` -> (H, W); None -> the codebase's default."""
    if not shape:
        return DEFAULT_SHAPES[codebase]
    shape = tuple(int(s) for s in shape)
    if len(shape) == 1:
        shape = shape * 2
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f'--shape takes H W (or one size S for S x S), got {shape}')
    return shape


def dummy_data_batch(codebase: str, shape: Tuple[int, int], batch_size: int = 1,
                     seed: int = 0) -> dict:
    """What a test dataloader yields for ``batch_size`` random H x W uint8 images.

    Images are taken as already resized (scale factor 1), so ``shape`` is the network
    input before the data preprocessor pads it.
    """
    h, w = shape
    gen = torch.Generator().manual_seed(seed)
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), scale_factor=(1.0, 1.0),
                flip=False, flip_direction=None)
    if codebase == 'mmdet':
        from mmdet.structures import DetDataSample as Sample
    elif codebase == 'mmseg':
        from mmseg.structures import SegDataSample as Sample
    else:
        raise ValueError(f'unknown codebase {codebase!r}; expected one of {CODEBASES}')
    return dict(
        inputs=[torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen)
                for _ in range(batch_size)],
        data_samples=[Sample(metainfo=dict(meta, img_id=i, img_path=f'dummy_{i}.jpg'))
                      for i in range(batch_size)])


def dummy_train_batch(codebase: str, shape: Tuple[int, int], num_classes: int,
                      batch_size: int = 2, instances: int = 4, seed: int = 0) -> dict:
    """What a training dataloader yields: :func:`dummy_data_batch` with ground truth.

    mmseg: a ``gt_sem_seg`` of ``num_classes`` labels in 16 x 16-pixel blocks (values
    below ``num_classes``, as after ``reduce_zero_label``). mmdet: ``gt_instances`` with
    ``instances`` random boxes per image, their labels and bitmap masks (the ellipse
    inscribed in each box), as ``PackDetInputs`` packs them.
    """
    import numpy as np
    batch = dummy_data_batch(codebase, shape, batch_size, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    h, w = shape
    if codebase == 'mmseg':
        from mmengine.structures import PixelData
        for sample in batch['data_samples']:
            blocks = torch.randint(0, num_classes, (1, 1, -(-h // 16), -(-w // 16)),
                                   generator=gen)
            labels = blocks.repeat_interleave(16, 2).repeat_interleave(16, 3)[0, :, :h, :w]
            sample.gt_sem_seg = PixelData(data=labels.long())
        return batch
    from mmdet.structures.bbox import HorizontalBoxes
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing='ij')
    for sample in batch['data_samples']:
        size = torch.tensor([float(w), float(h)])
        # widths and heights from 8 pixels to half the image, anywhere inside it
        wh = torch.minimum(8 + torch.rand(instances, 2, generator=gen) *
                           (size / 2 - 8).clamp(min=0), size)
        low = torch.rand(instances, 2, generator=gen) * (size - wh)
        high = low + wh
        boxes = torch.cat([low, high], 1)  # x1 y1 x2 y2
        centre, half = (low + high) / 2, (high - low) / 2
        masks = (((xs - centre[:, None, None, 0]) / half[:, None, None, 0]) ** 2 +
                 ((ys - centre[:, None, None, 1]) / half[:, None, None, 1]) ** 2) <= 1
        sample.gt_instances = InstanceData(
            bboxes=HorizontalBoxes(boxes),
            labels=torch.randint(0, num_classes, (instances,), generator=gen),
            masks=BitmapMasks(masks.numpy().astype(np.uint8), h, w))
    return batch


def preprocess_dummy(model: nn.Module, codebase: str, shape: Tuple[int, int],
                     batch_size: int = 1) -> dict:
    """:func:`dummy_data_batch` through ``model.data_preprocessor`` (test mode)."""
    with torch.no_grad():
        return model.data_preprocessor(dummy_data_batch(codebase, shape, batch_size), False)
