"""Data preprocessors that tell a pad-aware backbone each image's valid size.

Stock mmdet detectors and mmseg segmentors hand the preprocessor's batch tensor itself
to ``self.backbone(...)`` (mmdet's ``extract_feat(batch_inputs)``, mmseg's
``extract_feat(inputs)``). These subclasses run the stock preprocessing, then attach
each image's valid (h, w) (its data sample's ``img_shape``: the size before the batch
padding) to that tensor as the attribute
:data:`~mmplugin_inline.models.layers.padding.REAL_HW_ATTR`, a [B, 2] LongTensor; a
backbone built with ``pad_aware=True`` reads it (``docs/padding_aware.md``). Nothing
else changes: with a backbone whose mode is off the attribute is ignored.

In a config::

    model = dict(data_preprocessor=dict(type='PadAwareDetDataPreprocessor'),  # or Seg...
                 backbone=dict(pad_aware=True))

A tensor made from the batch (a slice, ``.to()``, a resize) does not carry the
attribute: such inputs (mmseg's slide-inference crops) run the default path.
"""
import importlib
from typing import List, Optional

import torch

from mmplugin_inline.models.layers.padding import REAL_HW_ATTR
from mmplugin_inline.registry import MODELS

__all__ = ['attach_valid_sizes']


def attach_valid_sizes(inputs, data_samples) -> None:
    """Set ``inputs.inline_real_hw`` ([B, 2] LongTensor) from the samples' ``img_shape``.

    Left unset when a sample lacks ``img_shape`` or the counts differ (nothing known).
    """
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 4 or not data_samples \
            or len(data_samples) != inputs.shape[0]:
        return
    sizes: List[Optional[tuple]] = [s.metainfo.get('img_shape') for s in data_samples]
    if any(s is None for s in sizes):
        return
    hw = torch.tensor([[int(s[0]), int(s[1])] for s in sizes], dtype=torch.long)
    setattr(inputs, REAL_HW_ATTR, hw)


def _codebase_class(module: str, name: str):
    """``module.name``, or None when that codebase is not installed (the backbones work
    without mmdet / mmseg; a codebase that is installed but fails to import raises)."""
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None
        raise


DetDataPreprocessor = _codebase_class('mmdet.models.data_preprocessors', 'DetDataPreprocessor')
if DetDataPreprocessor is not None:
    @MODELS.register_module()
    class PadAwareDetDataPreprocessor(DetDataPreprocessor):
        """mmdet's ``DetDataPreprocessor`` that also attaches the valid image sizes to
        the batch for a ``pad_aware`` backbone (module docstring). Same arguments."""

        def forward(self, data: dict, training: bool = False) -> dict:
            data = super().forward(data, training)
            attach_valid_sizes(data['inputs'], data['data_samples'])
            return data

    __all__.append('PadAwareDetDataPreprocessor')

SegDataPreProcessor = _codebase_class('mmseg.models.data_preprocessor', 'SegDataPreProcessor')
if SegDataPreProcessor is not None:
    @MODELS.register_module()
    class PadAwareSegDataPreProcessor(SegDataPreProcessor):
        """mmseg's ``SegDataPreProcessor`` that also attaches the valid image sizes to
        the batch for a ``pad_aware`` backbone (module docstring). Same arguments.

        mmseg's ``img_shape`` is the size before its padding to ``size`` /
        ``size_divisor`` (training, and testing with ``test_cfg``)."""

        def forward(self, data: dict, training: bool = False) -> dict:
            data = super().forward(data, training)
            attach_valid_sizes(data['inputs'], data.get('data_samples'))
            return data

    __all__.append('PadAwareSegDataPreProcessor')
