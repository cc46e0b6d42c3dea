"""The InLine backbone families, in plain PyTorch (timm's layers allowed).

Each family module holds everything particular to it (presets, released weights, the
signature and renames of its checkpoints). :data:`FAMILIES` lists them; the OpenMMLab face
(:mod:`mmplugin_inline.openmmlab.backbones`: ``InLinePVT``, ...) and the timm face
(:mod:`mmplugin_inline.timm_models`) are built over these classes. A new family: its
module, one import line here and its entry in :data:`FAMILIES`.
"""
from .base import InLineBackbone
from .inline_cswin import InLineCSWinNet
from .inline_deit import InLineDeiTNet
from .inline_pvt import InLinePVTNet
from .inline_swin import InLineSwinNet

#: the plain family classes, by their short name (file names, timm names: ``inline_pvt``)
FAMILIES = {cls.short_name: cls for cls in (InLinePVTNet, InLineSwinNet, InLineCSWinNet,
                                            InLineDeiTNet)}

__all__ = ['InLineBackbone', 'InLinePVTNet', 'InLineSwinNet', 'InLineCSWinNet',
           'InLineDeiTNet', 'FAMILIES']
