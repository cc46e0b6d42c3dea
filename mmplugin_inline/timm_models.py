"""The timm face: the InLine families as timm models, by the authors' names.

``import mmplugin_inline`` registers one timm model per released preset::

    inline_pvt_tiny / _small / _medium / _large     inline_swin_tiny / _small / _base
    inline_cswin_tiny / _small / _base              inline_deit_tiny / _small / _base

each with a ``pretrained_cfg`` (tag ``in1k``) that points at the authors' released ImageNet-1K
file. The model is the authors' classifier (same modules, same logits); it is a subclass
of the plain family (:mod:`mmplugin_inline.models.backbones`) with the authors' final
norm, pooling and head, so that ``features_only=True`` (timm's ``FeatureGetterNet`` over
:meth:`InLineClassifier.forward_intermediates`), smp's ``tu-`` encoders and transformers'
``TimmBackbone`` work at any input size.

- ``feature_info``: the four stages at strides 4 / 8 / 16 / 32 (PVT, Swin, CSWin); for
  DeiT, as timm's ViT: every block, stride 16 (``out_indices`` picks them).
- Keyword arguments: timm's ``in_chans``, ``num_classes``, ``global_pool``, ``drop_rate``,
  ``output_stride`` (None or 32: the families do not dilate), and the family's own
  (``block_types``, ``local_residual``, ``kernel``, ``pad_aware``, ``drop_path_rate``,
  ``arch`` for another size, ...).
- Pretrained files: ``pretrained=True`` downloads the authors' file (or, with
  ``pretrained_cfg_overlay=dict(file=PATH)``, reads a local one) and loads it through the
  plugin's safe loader (:func:`mmplugin_inline.weights.load_weights`): the authors'
  training format (``model``, ``optimizer``, a yacs ``config``, ...) is read as data, yacs
  need not be installed, and nothing in the file runs.
"""
import inspect
from collections import OrderedDict
from typing import List, Optional, Tuple, Union

import torch
import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import adapt_input_conv

from mmplugin_inline.core import nlc_to_nchw
from mmplugin_inline.logs import log
from mmplugin_inline.models.backbones import (
    InLineCSWinNet,
    InLineDeiTNet,
    InLinePVTNet,
    InLineSwinNet,
)
from mmplugin_inline.models.layers import build_norm, contiguous_map

#: timm's size names -> the families' preset keys
SIZES = {'tiny': 't', 'small': 's', 'medium': 'm', 'large': 'l', 'base': 'b'}


class InLineClassifier:
    """The authors' classifier over a plain family (put first among the bases:
    ``class InLinePVTClassifier(InLineClassifier, InLinePVTNet)``).

    A classifier names its ``family`` (the plain class) and says ``classifier_norm`` (the
    authors' final norm before pooling: none for PVT, a LayerNorm for Swin, CSWin and DeiT)
    and ``classifier_pool`` ('avg': the mean of the last stage's tokens; 'token': DeiT's cls
    token).

    Args:
        num_classes (int): classes of the head; 0: no head (``forward`` gives the pooled
            features). Default: 1000.
        global_pool (str, optional): 'avg', 'token' (DeiT) or '' (no pooling); None: the
            family's. Default: None.
        in_chans (int): input channels. Default: 3.
        drop_rate (float): dropout before the head and in the family. Default: 0.
        output_stride (int, optional): None or 32; the families do not dilate.
        **kwargs: the family's own arguments (``arch``, ``block_types``, ...).
    """
    classifier_norm = True
    classifier_pool = 'avg'

    def __init__(self, num_classes: int = 1000, global_pool: Optional[str] = None,
                 in_chans: int = 3, drop_rate: float = 0.0, output_stride: Optional[int] = None,
                 **kwargs):
        name = type(self).__name__
        if output_stride not in (None, 32):
            raise ValueError(f'{name}: output_stride={output_stride} is not supported: the '
                             'InLine families do not dilate their stages (strides 4 to 32, or '
                             '16 for DeiT); use output_stride=None or 32')
        for contract in ('out_indices', 'out_norm', 'final_norm'):
            if contract in kwargs:
                raise TypeError(f'{name}: {contract} is decided by the timm model (use '
                                'features_only=True, out_indices=... for feature maps)')
        family_args = dict(kwargs, in_channels=in_chans, drop_rate=drop_rate, out_indices=(-1,))
        family_args['out_norm' if self.classifier_pool == 'avg' else 'final_norm'] = False
        super().__init__(**family_args)
        norm_cfg = kwargs.get('norm_cfg', inspect.signature(
            self.family.__init__).parameters['norm_cfg'].default)
        self.num_features = self.head_hidden_size = self.embed_dims[-1]
        self.norm = build_norm(norm_cfg, self.num_features) if self.classifier_norm \
            else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.num_classes, self.global_pool = num_classes, None
        self.reset_classifier(num_classes, global_pool)
        patch = self.stages[0].downsample.stride
        self.feature_info = [
            dict(num_chs=c, reduction=patch if self.classifier_pool == 'token' else 4 * 2 ** i,
                 module=f'stages.{i}') for i, c in enumerate(self.embed_dims)]

    # -- timm's classifier interface ---------------------------------------------------
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new head for ``num_classes`` (0: none), with ``global_pool`` if given."""
        if global_pool is not None or self.global_pool is None:
            pool = self.classifier_pool if global_pool is None else global_pool
            allowed = ('', 'avg', 'token') if self.classifier_pool == 'token' else ('', 'avg')
            if pool not in allowed:
                raise ValueError(f'{type(self).__name__}: global_pool={pool!r}; use one of '
                                 f'{allowed}')
            self.global_pool = pool
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 \
            else nn.Identity()
        if num_classes > 0:
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's switch for gradient checkpointing (whole blocks)."""
        self.with_cp = bool(enable)

    def no_weight_decay(self) -> set:
        """Position embeddings and cls tokens (timm's optimizer factory reads this)."""
        return {n for n, _ in self.named_parameters()
                if n.endswith(('pos_embed', 'cls_token', 'relative_position_bias_table'))}

    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups for layer-wise decay: the stem, then the stages / blocks."""
        blocks = r'^stages\.(\d+)' if coarse else \
            [(r'^stages\.(\d+)\.blocks\.(\d+)', None), (r'^stages\.(\d+)\.', (0,))]
        return dict(stem=r'^stages\.0\.(downsample|cls_token|pos_embed)', blocks=blocks)

    # -- forward ---------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C_in, H, W] -> the last stage's tokens after the final norm, [B, N, C]."""
        return self.norm(self.run_stages(x, last=len(self.stages) - 1)[-1].x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pooled tokens through the head (``pre_logits``: before it)."""
        if self.global_pool == 'token':
            x = x[:, 0]
        elif self.global_pool == 'avg':
            x = x[:, int(self.classifier_pool == 'token'):].mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
            self, x: torch.Tensor, indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = 'NCHW',
            intermediates_only: bool = False
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """timm's feature interface: the NCHW maps after the stages in ``indices`` (None:
        all; an int n: the last n), at any input size; with ``norm``, the final norm on
        the maps it follows (the last stage's; every block's for DeiT, as timm's ViT).
        Returns the maps, or ``(final tokens, maps)`` unless ``intermediates_only``."""
        if output_fmt != 'NCHW':
            raise ValueError(f'{type(self).__name__}: output_fmt must be NCHW')
        take, max_index = feature_take_indices(len(self.stages), indices)
        last = max_index if (stop_early or intermediates_only) else len(self.stages) - 1
        maps = self.run_stages(x, last=last)
        intermediates = []
        for i in take:
            t = maps[i]
            tokens = t.x[:, t.num_prefix:]
            if norm and (self.classifier_pool == 'token' or i == len(self.stages) - 1):
                tokens = self.norm(tokens)
            if t.real is not None:
                tokens = t.real.zero(tokens)
            intermediates.append(contiguous_map(nlc_to_nchw(tokens, t.hw)))
        if intermediates_only:
            return intermediates
        return self.norm(maps[-1].x), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1,
                                  prune_norm: bool = False, prune_head: bool = True):
        """Drop the stages after the last of ``indices`` (and the final norm / head);
        returns the indices taken."""
        take, max_index = feature_take_indices(len(self.stages), indices)
        self.stages = self.stages[:max_index + 1]
        self.out_indices = (len(self.stages) - 1,)
        if hasattr(self, 'num_stages'):
            self.num_stages = len(self.stages)
        self.feature_info = self.feature_info[:max_index + 1]
        self._link_stages()
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, '')
        return take

    # -- the authors' files ---------------------------------------------------------
    def load_pretrained(self, path: str, allow_unsafe: bool = False) -> None:
        """Load the authors' released file (or any checkpoint of the authors' keys) at
        ``path`` through the plugin's safe loader; what timm calls for ``custom_load``.

        Every parameter must be matched, except the head when ``num_classes`` differs from
        the file's (it keeps its initialisation); ``in_chans`` other than 3 adapts the
        first convolution as timm does. Raises RuntimeError naming what did not fit.
        """
        from mmplugin_inline.weights import convert_state_dict, load_weights, split_checkpoint
        name = type(self).__name__
        raw, ignored = split_checkpoint(load_weights(path, allow_unsafe=allow_unsafe))
        own_keys = ('head.weight', 'head.bias', 'norm.weight', 'norm.bias')
        kept = OrderedDict((k, raw.pop(k)) for k in own_keys if k in raw)
        sd = convert_state_dict(raw, self.family, self)
        if not self.classifier_norm:
            kept.pop('norm.weight', None), kept.pop('norm.bias', None)
        head = [k for k in kept if k.startswith('head.')]
        if self.num_classes == 0 or (head and kept['head.weight'].shape[0] != self.num_classes):
            for k in head:
                del kept[k]
            log(f'{name}: the head of {path} was not loaded (num_classes={self.num_classes})')
        sd.update(kept)
        first = self.pretrained_cfg.get('first_conv') if hasattr(self, 'pretrained_cfg') \
            else None
        weight = f'{first}.weight' if first else None
        if weight in sd and sd[weight].shape[1] != self.in_channels:
            sd[weight] = adapt_input_conv(self.in_channels, sd[weight])
        own = self.state_dict()
        missing = [k for k in own if k not in sd and not k.startswith('head.')]
        unexpected = [k for k in sd if k not in own]
        shapes = [f'{k}: {list(sd[k].shape)} in the file, {list(own[k].shape)} here'
                  for k in sd if k in own and sd[k].shape != own[k].shape]
        if missing or unexpected or shapes:
            raise RuntimeError(
                f'{name}: {path} does not fit this model ({len(missing)} missing, '
                f'{len(unexpected)} unexpected, {len(shapes)} of another shape; e.g. missing '
                f'{missing[:3]}, unexpected {unexpected[:3]}, {shapes[:2]}). Give the file of '
                'this preset, or pass the arch the file was made for (arch=dict(...))')
        result = self.load_state_dict(sd, strict=False)
        left = [k for k in result.missing_keys if not k.startswith('head.')]
        if left or result.unexpected_keys:  # e.g. a legacy-key upgrade renamed a key
            raise RuntimeError(f'{name}: loading {path} left {left[:3]} missing and '
                               f'{result.unexpected_keys[:3]} unexpected')
        log(f'{name}: loaded {len(sd)} entries from {path}' +
            (f'; ignored (not weights): {", ".join(ignored)}' if ignored else ''))


class InLinePVTClassifier(InLineClassifier, InLinePVTNet):
    """InLine-PVT as the authors' classifier: the mean of the last stage's tokens (no
    final norm), then the head."""
    family = InLinePVTNet
    classifier_norm = False


class InLineSwinClassifier(InLineClassifier, InLineSwinNet):
    """InLine-Swin as the authors' classifier: final LayerNorm, mean, head."""
    family = InLineSwinNet


class InLineCSWinClassifier(InLineClassifier, InLineCSWinNet):
    """InLine-CSWin as the authors' classifier: final LayerNorm, mean, head."""
    family = InLineCSWinNet


class InLineDeiTClassifier(InLineClassifier, InLineDeiTNet):
    """InLine-DeiT as the authors' classifier: final LayerNorm, the cls token, head.
    ``features_only``: the maps after each block (stride 16), as timm's ViT."""
    family = InLineDeiTNet
    classifier_pool = 'token'

    @property
    def norm(self) -> nn.Module:
        """The classifier's final norm (the family's ``norm`` is its last stage's)."""
        return self._modules['norm']

    @classmethod
    def legacy_renames(cls, num_stages=None):
        """The family's renames, less the final norm's: the classifier keeps it as
        ``norm`` (the authors' name), not in the last stage."""
        return super().legacy_renames(None)


CLASSIFIERS = {'inline_pvt': InLinePVTClassifier, 'inline_swin': InLineSwinClassifier,
               'inline_cswin': InLineCSWinClassifier, 'inline_deit': InLineDeiTClassifier}
#: the stem's first convolution (what ``in_chans`` adapts)
_FIRST_CONV = {'inline_pvt': 'stages.0.downsample.proj',
               'inline_swin': 'stages.0.downsample.proj',
               'inline_cswin': 'stages.0.downsample.0',
               'inline_deit': 'stages.0.downsample.proj'}
_DEIT_SIZES = {'t': 224, 's': 288, 'b': 448}


def _cfg(family: str, preset: str) -> dict:
    cls = CLASSIFIERS[family]
    model, url = cls.released_weights[preset]
    size = _DEIT_SIZES[preset] if family == 'inline_deit' else 224
    return dict(
        # (address, file name): the authors' addresses end in '?dl=1', with no file name
        url=(url, f'{family}_{preset}.pth'), custom_load=True, num_classes=1000,
        input_size=(3, size, size), pool_size=None, crop_pct=0.875 if size == 224 else 1.0,
        interpolation='bicubic', mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
        first_conv=_FIRST_CONV[family], classifier='head', fixed_input_size=False,
        description=f"{model}, the InLine authors' ImageNet-1K release")


def timm_names() -> List[str]:
    """The registered model names (without pretrained tags), family by family."""
    return [f'{family}_{size}' for family, cls in CLASSIFIERS.items()
            for size, key in SIZES.items() if key in cls.released_weights]


default_cfgs = generate_default_cfgs({
    f'{name}.in1k': _cfg(name.rsplit('_', 1)[0], SIZES[name.rsplit('_', 1)[1]])
    for name in timm_names()})


def _create(name: str, pretrained: bool = False, **kwargs) -> nn.Module:
    family, size = name.rsplit('_', 1)
    kwargs.setdefault('arch', SIZES[size])
    out_indices = kwargs.pop('out_indices', None)
    cls = CLASSIFIERS[family]
    if out_indices is None:
        out_indices = (3, 5, 7, 11) if family == 'inline_deit' else (0, 1, 2, 3)
    return build_model_with_cfg(cls, name, pretrained,
                                feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
                                **kwargs)


def _register(name: str) -> None:
    def entry(pretrained: bool = False, **kwargs) -> nn.Module:
        return _create(name, pretrained, **kwargs)
    entry.__name__ = entry.__qualname__ = name
    entry.__module__ = __name__
    entry.__doc__ = f'{name}: the InLine authors\' model as a timm model (see {__name__}).'
    globals()[name] = register_model(entry)


for _name in timm_names():
    _register(_name)

__all__ = ['InLineClassifier', 'CLASSIFIERS', 'timm_names'] + timm_names()
