"""The OpenMMLab face of the backbone families: registered, ``BaseModule`` backbones.

Each family is defined once in plain PyTorch (:mod:`mmplugin_inline.models.backbones`);
the classes here add what mmdet and mmseg expect of a backbone and nothing else:

- ``init_cfg`` (``BaseModule``): ``dict(type='Pretrained', checkpoint=PATH)`` loads the
  authors' released classification checkpoint through the plugin's safe loader
  (:func:`mmplugin_inline.weights.load_pretrained`); other types go to mmengine;
- ``frozen_stages`` (re-applied in ``train()``) and ``norm_eval``;
- ``norm_cfg`` / ``act_cfg`` of any type mmcv registers (the plain models build 'LN' and
  the usual activations themselves; anything else is built here by mmcv);
- the registries: ``type='InLinePVT'`` under mmdet's and mmseg's scopes.

Same modules, same state-dict keys and the same outputs as the plain model with the same
arguments.
"""
import copy

import torch.nn as nn
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from mmplugin_inline.models.backbones import (
    InLineCSWinNet,
    InLineDeiTNet,
    InLinePVTNet,
    InLineSwinNet,
)
from mmplugin_inline.models.layers.factories import builds_here
from mmplugin_inline.registry import MODELS
from mmplugin_inline.weights import load_pretrained


def _mmcv_layers(kwargs: dict) -> dict:
    """``norm_cfg`` / ``act_cfg`` dicts the plain models do not build themselves, as
    callables that mmcv builds (so any type mmcv registers works, as in mmdet's own
    backbones)."""
    norm, act = kwargs.get('norm_cfg'), kwargs.get('act_cfg')
    if isinstance(norm, dict) and not builds_here(norm, 'norm_cfg'):
        kwargs['norm_cfg'] = lambda dim, cfg=copy.deepcopy(norm): build_norm_layer(cfg, dim)[1]
    if isinstance(act, dict) and not builds_here(act, 'act_cfg'):
        kwargs['act_cfg'] = lambda cfg=copy.deepcopy(act): build_activation_layer(cfg)
    return kwargs


class OpenMMLabBackbone:
    """The OpenMMLab backbone contract over a plain family (put first among the bases,
    with ``BaseModule`` last: ``class InLinePVT(OpenMMLabBackbone, InLinePVTNet,
    BaseModule)``).

    Args:
        frozen_stages (int): -1 freezes nothing; 0 the stem (the first stage's
            embedding); ``k`` the stem and the first ``k`` stages. Holds after ``train()``.
            Default: -1.
        norm_eval (bool): keep BatchNorm layers (if any are configured) in eval mode
            while training. Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads a
            released checkpoint (``allow_unsafe``, ``verify_hash`` as in
            :func:`~mmplugin_inline.weights.load_pretrained`); None: the authors'
            initialisation; other types: mmengine's initialisers.
        **kwargs: the family's own arguments.
    """

    def __init__(self, *args, frozen_stages: int = -1, norm_eval: bool = False,
                 init_cfg=None, **kwargs):
        super().__init__(*args, **_mmcv_layers(kwargs))
        self.init_cfg = copy.deepcopy(init_cfg)
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval

    def _freeze_stages(self) -> None:
        groups = self.stage_modules()
        if not -1 <= self.frozen_stages < len(groups):
            raise ValueError(f'{type(self).__name__}: frozen_stages={self.frozen_stages} is out '
                             f'of range: -1 freezes nothing, 0 the stem, k the stem and the first '
                             f'k of the {len(groups) - 1} stages; use -1 to {len(groups) - 1}')
        for group in groups[:self.frozen_stages + 1]:
            for m in group:
                if isinstance(m, nn.Parameter):
                    m.requires_grad = False
                    continue
                m.eval()
                for p in m.parameters():
                    p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def init_weights(self) -> None:
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            checkpoint = cfg.get('checkpoint')
            if not checkpoint:
                raise ValueError(f"{type(self).__name__}: init_cfg type='Pretrained' needs "
                                 'checkpoint=PATH')
            self._init_from_scratch()
            load_pretrained(self, checkpoint, allow_unsafe=cfg.get('allow_unsafe', False),
                            verify_hash=cfg.get('verify_hash', True))
            self._is_init = True
            return
        if cfg is None:
            self._init_from_scratch()
            self._is_init = True
            return
        super().init_weights()


@MODELS.register_module()
class InLinePVT(OpenMMLabBackbone, InLinePVTNet, BaseModule):
    __doc__ = InLinePVTNet.__doc__


@MODELS.register_module()
class InLineSwinTransformer(OpenMMLabBackbone, InLineSwinNet, BaseModule):
    __doc__ = InLineSwinNet.__doc__


@MODELS.register_module()
class InLineCSWinTransformer(OpenMMLabBackbone, InLineCSWinNet, BaseModule):
    __doc__ = InLineCSWinNet.__doc__


@MODELS.register_module()
class InLineDeiT(OpenMMLabBackbone, InLineDeiTNet, BaseModule):
    __doc__ = InLineDeiTNet.__doc__


__all__ = ['OpenMMLabBackbone', 'InLinePVT', 'InLineSwinTransformer', 'InLineCSWinTransformer',
           'InLineDeiT']
