"""The models of mmplugin_inline in plain PyTorch: the layers and the backbone families.

Nothing here imports an OpenMMLab package; the OpenMMLab face (registered backbones,
necks, data preprocessors) is :mod:`mmplugin_inline.openmmlab`, the timm face
:mod:`mmplugin_inline.timm_models`.
"""
from .backbones import (
                        FAMILIES,
                        InLineBackbone,
                        InLineCSWinNet,
                        InLineDeiTNet,
                        InLinePVTNet,
                        InLineSwinNet,
)

__all__ = ['FAMILIES', 'InLineBackbone', 'InLinePVTNet', 'InLineSwinNet', 'InLineCSWinNet',
           'InLineDeiTNet']
