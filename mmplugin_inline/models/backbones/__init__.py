"""The four InLine backbone families."""
from .base import InLineBackbone
from .inline_cswin import InLineCSWinTransformer
from .inline_deit import InLineDeiT
from .inline_pvt import InLinePVT
from .inline_swin import InLineSwinTransformer

__all__ = ['InLineBackbone', 'InLinePVT', 'InLineSwinTransformer', 'InLineCSWinTransformer',
           'InLineDeiT']
