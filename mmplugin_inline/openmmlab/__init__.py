"""The OpenMMLab face: registered backbones (over the plain families of
:mod:`mmplugin_inline.models`), the ViTDet-style neck and the pad-aware data
preprocessors. Imported by ``import mmplugin_inline`` where mmengine and mmcv are
installed."""
from . import data_preprocessors  # noqa: F401  (registers them where mmdet / mmseg exist)
from .backbones import (
                        InLineCSWinTransformer,
                        InLineDeiT,
                        InLinePVT,
                        InLineSwinTransformer,
                        OpenMMLabBackbone,
)
from .necks import SimpleFeaturePyramid

__all__ = ['OpenMMLabBackbone', 'InLinePVT', 'InLineSwinTransformer', 'InLineCSWinTransformer',
           'InLineDeiT', 'SimpleFeaturePyramid']
