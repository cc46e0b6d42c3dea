"""Models of mmplugin_inline: importing this registers them in the plugin's registry."""
from .backbones import (InLineBackbone, InLineCSWinTransformer, InLineDeiT, InLinePVT,
                        InLineSwinTransformer)
from .necks import SimpleFeaturePyramid
from . import data_preprocessors  # noqa: F401,E402  (registers them where mmdet / mmseg exist)

__all__ = ['InLineBackbone', 'InLinePVT', 'InLineSwinTransformer', 'InLineCSWinTransformer',
           'InLineDeiT', 'SimpleFeaturePyramid']
