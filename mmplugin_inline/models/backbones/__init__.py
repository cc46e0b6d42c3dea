"""The InLine backbone families.

Each family module holds everything particular to it (presets, released weights, the
signature and renames of its checkpoints); importing it registers the family, and
:func:`mmplugin_inline.registry.registered_families` lists what is registered. A new
family: its module and one import line here.
"""
from .base import InLineBackbone
from .inline_cswin import InLineCSWinTransformer
from .inline_deit import InLineDeiT
from .inline_pvt import InLinePVT
from .inline_swin import InLineSwinTransformer

__all__ = ['InLineBackbone', 'InLinePVT', 'InLineSwinTransformer', 'InLineCSWinTransformer',
           'InLineDeiT']
