"""Norm and activation layers from a config dict or a callable, in plain PyTorch.

The families take ``norm_cfg`` / ``act_cfg`` as OpenMMLab configs spell them
(``dict(type='LN', eps=1e-6)``, ``dict(type='GELU')``) or as a callable that builds the
layer (``norm_cfg=partial(nn.LayerNorm, eps=1e-6)``, timm's ``norm_layer`` style). The
types a token model uses are built here without OpenMMLab; the OpenMMLab face hands any
other registered type over as a callable built by mmcv
(:mod:`mmplugin_inline.openmmlab.backbones`).
"""
from typing import Callable, Union

import torch.nn as nn

#: norm types built here: name -> (class, how the width is passed)
NORMS = {'LN': nn.LayerNorm, 'LayerNorm': nn.LayerNorm}
#: activation types built here, by their OpenMMLab / torch names
ACTIVATIONS = {'GELU': nn.GELU, 'ReLU': nn.ReLU, 'SiLU': nn.SiLU, 'Swish': nn.SiLU,
               'ReLU6': nn.ReLU6, 'LeakyReLU': nn.LeakyReLU, 'ELU': nn.ELU, 'Tanh': nn.Tanh,
               'Sigmoid': nn.Sigmoid, 'HSwish': nn.Hardswish, 'Hardswish': nn.Hardswish,
               'Identity': nn.Identity}

LayerSpec = Union[dict, Callable[..., nn.Module]]


def _type_of(cfg: dict, what: str) -> str:
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise TypeError(f'{what} must be a dict with a type (e.g. dict(type='
                        f"{'LN' if what == 'norm_cfg' else 'GELU'!r})) or a callable that builds "
                        f'the layer, got {cfg!r}')
    return cfg['type'] if isinstance(cfg['type'], str) else cfg['type'].__name__


def builds_here(cfg, what: str = 'norm_cfg') -> bool:
    """Whether :func:`build_norm` / :func:`build_act` build ``cfg`` without OpenMMLab."""
    if callable(cfg):
        return True
    table = NORMS if what == 'norm_cfg' else ACTIVATIONS
    return _type_of(cfg, what) in table or isinstance(cfg.get('type'), type)


def build_norm(cfg: LayerSpec, dim: int) -> nn.Module:
    """The norm layer of width ``dim`` that ``cfg`` describes.

    ``cfg``: a callable ``cfg(dim)``, or a dict whose ``type`` is 'LN' (or an ``nn.Module``
    class taking the width first), the rest its keyword arguments; ``requires_grad=False``
    freezes its parameters (as OpenMMLab's key does).
    """
    if callable(cfg) and not isinstance(cfg, dict):
        return cfg(dim)
    name = _type_of(cfg, 'norm_cfg')
    args = {k: v for k, v in cfg.items() if k not in ('type', 'requires_grad')}
    cls = cfg['type'] if isinstance(cfg['type'], type) else NORMS.get(name)
    if cls is None:
        raise ValueError(f'norm_cfg type {name!r} is not built by the plain-PyTorch models '
                         f'(they build {sorted(NORMS)}); pass a callable dim -> module, or use '
                         'the OpenMMLab backbones, which build any norm mmcv registers')
    layer = cls(dim, **args)
    for p in layer.parameters():
        p.requires_grad = cfg.get('requires_grad', True)
    return layer


def build_act(cfg: LayerSpec) -> nn.Module:
    """The activation layer ``cfg`` describes: a callable ``cfg()``, or a dict whose
    ``type`` names it (:data:`ACTIVATIONS`, or an ``nn.Module`` class), the rest its
    keyword arguments."""
    if callable(cfg) and not isinstance(cfg, dict):
        return cfg()
    name = _type_of(cfg, 'act_cfg')
    args = {k: v for k, v in cfg.items() if k != 'type'}
    cls = cfg['type'] if isinstance(cfg['type'], type) else ACTIVATIONS.get(name)
    if cls is None:
        raise ValueError(f'act_cfg type {name!r} is not built by the plain-PyTorch models '
                         f'(they build {sorted(ACTIVATIONS)}); pass a callable that returns '
                         'the module, or use the OpenMMLab backbones, which build any '
                         'activation mmcv registers')
    return cls(**args)
