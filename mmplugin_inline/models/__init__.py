"""Models of mmplugin_inline: importing this registers them in the plugin's registry."""
from . import data_preprocessors  # noqa: F401,E402  (registers them where mmdet / mmseg exist)
from .backbones import (
                        InLineBackbone,
                        InLineCSWinTransformer,
                        InLineDeiT,
                        InLinePVT,
                        InLineSwinTransformer,
)
from .necks import SimpleFeaturePyramid

__all__ = ['InLineBackbone', 'InLinePVT', 'InLineSwinTransformer', 'InLineCSWinTransformer',
           'InLineDeiT', 'SimpleFeaturePyramid']
