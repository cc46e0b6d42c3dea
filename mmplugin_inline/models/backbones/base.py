"""What the InLine backbones share: one loop over the stages, the facts each family
declares and the checkpoint hooks; plain PyTorch (the OpenMMLab contract, ``init_cfg``,
``frozen_stages`` and ``norm_eval``, is the face in :mod:`mmplugin_inline.openmmlab`)."""
import copy
import functools
import itertools
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmplugin_inline.core import nlc_to_nchw
from mmplugin_inline.models.layers import (
    REAL_HW_ATTR,
    TokenMap,
    build_norm,
    check_with_cp,
    contiguous_map,
    parse_block_types,
    real_grid_of,
    stochastic_depth_rates,
)
from mmplugin_inline.weights import rename_keys

from .input_checks import check_finite, check_input
from .legacy_keys import MIXER_RENAMES

ARCH_ALIASES = {'tiny': 't', 'small': 's', 'medium': 'm', 'base': 'b', 'large': 'l'}


def preset_key(arch: str) -> str:
    """The ``arch_settings`` key a preset name means (``'Tiny'`` -> ``'t'``)."""
    key = arch.lower()
    return ARCH_ALIASES.get(key, key)


def resolve_arch(arch, settings: dict, family: str, required: Sequence[str]) -> dict:
    """A preset by name (``'t'``, ``'tiny'``, ...) or an explicit dict with ``required`` keys."""
    if isinstance(arch, str):
        key = preset_key(arch)
        if key not in settings:
            raise ValueError(f'{family}: unknown arch {arch!r}; choose one of '
                             f'{sorted(settings)} or pass a dict with {list(required)}')
        return copy.deepcopy(settings[key])
    if isinstance(arch, dict):
        missing = [k for k in required if k not in arch]
        if missing:
            raise ValueError(f'{family}: arch dict lacks {missing} (needs {list(required)})')
        return copy.deepcopy(arch)
    raise TypeError(f'{family}: arch must be a preset name or a dict, got {type(arch).__name__}')


def normalize_out_indices(out_indices, num_outputs: int, family: str):
    """Validate ``out_indices`` (negative indices allowed) into a sorted tuple."""
    if isinstance(out_indices, int):
        out_indices = (out_indices,)
    result = []
    for i in out_indices:
        j = i + num_outputs if i < 0 else i
        if not 0 <= j < num_outputs:
            raise ValueError(f'{family}: out_indices {tuple(out_indices)} out of range: this '
                             f'model has {num_outputs} outputs; use indices 0 to '
                             f'{num_outputs - 1} (or -{num_outputs} to -1)')
        result.append(j)
    return tuple(sorted(set(result)))


def fp32_under_autocast(x: torch.Tensor) -> torch.Tensor:
    """The dtype policy of every family's outputs: float32 under autocast.

    mmdet's own Swin and PVT end each output with a LayerNorm, which CUDA autocast
    runs in float32, so their maps are float32 under ``--amp``; ours are too, on any
    device (CPU autocast would otherwise give some outputs bf16). Outside autocast the
    outputs keep the dtype they were computed in.
    """
    if x.is_floating_point() and x.dtype not in (torch.float32, torch.float64) \
            and torch.is_autocast_enabled(x.device.type):
        return x.float()  # preserves the (contiguous) layout
    return x


class InLineBackbone(nn.Module):
    """Base of the InLine backbones: a list of stages run by one loop.

    A family builds ``self.stages``, an ``nn.ModuleList`` of
    :class:`~mmplugin_inline.models.layers.Stage` (downsampling or embedding, optional
    cls token and position embedding, blocks, output norm), and may define the
    classmethod ``checkpoint_filter(sd, model)``; :meth:`forward` is the one loop over the
    stages, passing a :class:`~mmplugin_inline.models.layers.TokenMap` from one to the
    next. State-dict keys are ``stages.<i>.<downsample|cls_token|pos_embed|blocks|norm>``;
    files of release 0.1 load through the family's :meth:`legacy_renames`, applied on any
    ``load_state_dict`` (mmengine's ``load_checkpoint``, ``load_from``, ``--resume``) and
    by :meth:`checkpoint_filter` (``init_cfg=dict(type='Pretrained')``).

    A family keeps its facts beside it, as class attributes: ``arch_settings`` (the
    presets), ``short_name`` (its name in file names: ``checkpoints/<short_name>_<arch>.pth``,
    ``configs/<short_name>/``), ``released_weights`` (the authors' released ImageNet-1K
    weights per preset: ``{arch: (model name, URL)}``), ``checkpoint_signature`` (a regex
    matching keys only its released checkpoints have), ``checkpoint_buffers`` (a regex
    of the buffers they hold that the backbone rebuilds: dropped on loading), and the
    classmethod ``config_from_authors_args(args)`` (this backbone's arguments for the
    authors' model built with ``args``). The converter and preflight read them from
    :func:`mmplugin_inline.registry.registered_families`. What a family does to a
    released checkpoint is one hook beside it, the classmethod
    ``checkpoint_filter(sd, model=None)`` (as timm's ``checkpoint_filter_fn``): the
    renames from the released key names to the backbone's, and given the model, the
    adaptation to it (resized position embeddings and tables, the final norm's place).

    The arguments of that contract (``frozen_stages``, ``norm_eval``, ``with_cp``,
    ``init_cfg``, ``check_finite``, ``pad_aware``) reach :meth:`__init__` from a
    family's keyword arguments (``**contract``), beside its own and ``in_channels``.

    ``frozen_stages``: -1 freezes nothing; 0 the stem (the first stage's embedding); ``k``
    the stem and the first ``k`` stages (each with the downsampling before its blocks). It
    holds after ``train()``. ``norm_eval`` keeps BatchNorm layers (if any are configured)
    in eval mode during training.
    ``with_cp`` (gradient checkpointing while training): False keeps every activation;
    True recomputes each whole block in the backward pass; 'mlp' only the norm2 + MLP
    half of each block (its widest activations); 'attn' only the norm1 + attention
    half. Anything else is a ValueError naming these.
    ``init_cfg=dict(type='Pretrained', checkpoint=PATH)`` loads the authors' released
    classification checkpoint (see :mod:`mmplugin_inline.weights.convert`).

    ``pad_aware`` (default False: the authors' outputs): an image's features do not
    depend on the padding of its batch. ``forward(x, real_hw=None)`` then takes each
    image's valid (h, w) in pixels (a list of pairs or a [B, 2] LongTensor), or reads
    them from the input's ``inline_real_hw`` attribute (set by the plugin's data
    preprocessors, :mod:`mmplugin_inline.openmmlab.data_preprocessors`); the padded tokens
    stay out of every statistic and spatial op, stage by stage, and are zero in the
    outputs (``docs/padding_aware.md``). Without known sizes, or when no image is
    padded, the default path runs (without known sizes, after one warning per model).

    Every family takes ``block_types`` (the block letters: 'I' InLine, 'S' softmax, 'L'
    plain linear attention; :data:`~mmplugin_inline.models.layers.MIXERS`), ``kernel``
    (the feature map phi of the linear blocks; None, the default, takes each mixer's
    own: 'identity' for InLine, 'relu' for 'L', which refuses a map that can make its
    normaliser zero) and ``local_residual`` (True by default; False builds the 'I' and
    'L' blocks without the local residual and its parameters: the paper's "without
    local modelling").

    ``forward`` starts with :meth:`_check_input` (a float ``[B, in_channels, H, W]``
    batch, not empty). ``check_finite=True`` (off by default: it reads every value)
    also stops at the first NaN / Inf, naming where it appeared: the input, the stem
    or stage k (:meth:`_check_finite`, called after the stem and each stage).
    """

    is_backbone_family = True  # listed by mmplugin_inline.registry.registered_families
    arch_settings: Dict[str, dict] = {}
    short_name: str = ''
    released_weights: Dict[str, Tuple[str, str]] = {}
    checkpoint_signature: Optional[str] = None
    checkpoint_buffers: Optional[str] = None
    #: what ``check_finite`` calls a stage in its messages
    stage_unit = 'stage'

    def __init__(self, with_cp=False, in_channels: int = 3, check_finite: bool = False,
                 pad_aware: bool = False):
        super().__init__()
        self.pad_aware = bool(pad_aware)
        self._warned_no_sizes = False
        self.in_channels = in_channels
        self.with_cp = with_cp
        self.check_finite = check_finite

    @property
    def with_cp(self):
        """Gradient checkpointing of the blocks (see the class docstring); setting it
        reaches every stage."""
        return self._with_cp

    @with_cp.setter
    def with_cp(self, value) -> None:
        self._with_cp = check_with_cp(value, type(self).__name__)
        for stage in getattr(self, 'stages', ()):
            stage.with_cp = self._with_cp

    @property
    def check_finite(self) -> bool:
        """Stop at the first NaN / Inf (see the class docstring); setting it reaches every
        stage."""
        return self._check_finite_on

    @check_finite.setter
    def check_finite(self, value: bool) -> None:
        self._check_finite_on = bool(value)
        for i, stage in enumerate(getattr(self, 'stages', ())):
            stage.finite_check = functools.partial(self._stage_finite_check, i) \
                if self._check_finite_on else None

    def _link_stages(self) -> None:
        """Tell the stages, once built, what the backbone decides for them: gradient
        checkpointing, the finite check, and which emit an output (``out_indices``)."""
        for i, stage in enumerate(self.stages):
            stage.emits_output = i in self.out_indices
        self.with_cp, self.check_finite = self.with_cp, self.check_finite

    def _stage_finite_check(self, index: int, x: torch.Tensor, part: str) -> None:
        """A stage's finite check: after the first stage's embedding (the stem, 0) and
        after each stage's blocks (``index + 1``)."""
        if part == 'embedded' and index == 0:
            self._check_finite(x, 0)
        elif part == 'done':
            self._check_finite(x, index + 1, self.stage_unit)

    @classmethod
    def released_files(cls) -> Dict[str, Tuple[str, str]]:
        """``{file name the configs expect under checkpoints/: (model name, URL)}``."""
        return {f'{cls.short_name}_{arch}.pth': weights
                for arch, weights in cls.released_weights.items()}

    @classmethod
    def checkpoint_filter(cls, sd: Dict[str, torch.Tensor],
                          model: Optional['InLineBackbone'] = None) -> Dict[str, torch.Tensor]:
        """The family's hook on a released checkpoint's state dict (classifier and buffers
        dropped already): its keys renamed to the backbone's and, given ``model``, adapted
        to that model. Renames must leave the backbone's own key names as they are: a
        converted file comes through here again. The default applies the legacy-key
        upgrade (:meth:`upgrade_legacy_keys`) only."""
        return cls.upgrade_legacy_keys(sd, model=model)

    @classmethod
    def legacy_renames(cls, num_stages: Optional[int] = None) -> list:
        """``(regex, replacement)`` pairs from the keys of release 0.1 (the module tree
        before the stages were unified) to this family's keys, after the mixer's rename
        (:data:`MIXER_RENAMES`). ``num_stages`` is the model's, where a rename needs it."""
        return []

    @classmethod
    def upgrade_legacy_keys(cls, sd: Dict[str, torch.Tensor], prefix: str = '',
                            model: Optional['InLineBackbone'] = None
                            ) -> Dict[str, torch.Tensor]:
        """The one legacy-key upgrade: the keys of ``sd`` under ``prefix`` renamed from
        release 0.1's module tree to today's (keys already new are left as they are)."""
        num_stages = len(model.stages) if model is not None else None
        renames = MIXER_RENAMES + cls.legacy_renames(num_stages)
        if not prefix:
            return rename_keys(sd, renames)
        inner = rename_keys({k[len(prefix):]: None for k in sd if k.startswith(prefix)}, renames)
        names = dict(zip((k for k in sd if k.startswith(prefix)), inner))
        return type(sd)((prefix + names[k] if k in names else k, v) for k, v in sd.items())

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        """Every ``load_state_dict`` (torch's, mmengine's ``load_checkpoint``, ``load_from``,
        ``--resume``) reads files of release 0.1 through :meth:`upgrade_legacy_keys`."""
        upgraded = self.upgrade_legacy_keys(state_dict, prefix, self)
        if list(upgraded) != list(state_dict):
            state_dict.clear()
            state_dict.update(upgraded)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs)

    def adapt_pretrained(self, sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """``sd`` (a released checkpoint's state dict) through this model's family hook,
        :meth:`checkpoint_filter`, with this model."""
        return self.checkpoint_filter(sd, self)

    def _init_pyramid(self, cfg: dict, out_indices, block_types: str, drop_path_rate: float):
        """Stage layout of a hierarchical family.

        The widths are ``cfg['embed_dims']`` (one per stage) or, without it, doubling
        from ``cfg['embed_dim']``. Sets ``num_stages``, ``embed_dims`` and ``out_indices``;
        returns the widths, the block type of every block and its drop-path rate (both
        per stage).
        """
        depths, name = cfg['depths'], type(self).__name__
        self.num_stages = len(depths)
        self.embed_dims = cfg['embed_dims'] if 'embed_dims' in cfg else \
            [cfg['embed_dim'] * 2 ** i for i in range(self.num_stages)]
        self.out_indices = normalize_out_indices(out_indices, self.num_stages, name)
        return (self.embed_dims, parse_block_types(block_types, depths, name),
                stochastic_depth_rates(depths, drop_path_rate))

    def _add_out_norms(self, out_norm: bool, norm_cfg: dict) -> None:
        """One norm per output (the norm of each stage in ``out_indices``)."""
        self.out_norm = out_norm
        if out_norm:
            for i in self.out_indices:
                self.stages[i].norm = build_norm(norm_cfg, self.embed_dims[i])

    @staticmethod
    def _as_map(t: TokenMap) -> torch.Tensor:
        """A stage's output tokens (:attr:`TokenMap.out`) as a contiguous NCHW map, float32
        under autocast."""
        return fp32_under_autocast(contiguous_map(nlc_to_nchw(t.out, t.hw)))

    def run_stages(self, x: torch.Tensor, real_hw=None, last: Optional[int] = None
                   ) -> List[TokenMap]:
        """The one forward loop: hands the token bundle from stage to stage, up to stage
        ``last`` (default: the last of ``out_indices``; later ones would be unused);
        returns the :class:`TokenMap` after each stage run."""
        self._check_input(x)
        real = self._real_pixels(x, real_hw)
        t = TokenMap(self._stem_input(x, real), tuple(x.shape[-2:]), real)
        maps = []
        # islice, not self.stages[:n]: slicing builds a new ModuleList on every forward
        for stage in itertools.islice(
                self.stages, (max(self.out_indices) if last is None else last) + 1):
            t = stage(t)
            maps.append(t)
        return maps

    def forward(self, x: torch.Tensor, real_hw=None) -> Tuple[torch.Tensor, ...]:
        """x: [B, C_in, H, W] -> a tuple of NCHW maps, one per ``out_indices``.

        ``real_hw``: each image's valid (h, w) in pad-aware mode (see the class
        docstring).
        """
        maps = self.run_stages(x, real_hw)
        return tuple(self._as_map(maps[i]) for i in self.out_indices)

    def _real_pixels(self, x: torch.Tensor, real_hw=None):
        """Pad-aware mode: the pixel :class:`~mmplugin_inline.models.layers.RealGrid`
        of the batch ``x`` (None when the mode is off, no sizes are known or nothing is
        padded: the default path). In the mode, an input that carries no sizes gets one
        warning per model: the padding then reaches the features, which is what the mode
        is for (usually the config kept the stock data preprocessor)."""
        if not self.pad_aware:
            if real_hw is not None:
                raise ValueError(f'{type(self).__name__}: real_hw is read in pad-aware mode '
                                 'only; build the backbone with pad_aware=True')
            return None
        if real_hw is None and getattr(x, REAL_HW_ATTR, None) is None \
                and not self._warned_no_sizes:
            self._warned_no_sizes = True
            warnings.warn(
                f'{type(self).__name__} was built with pad_aware=True, but its input carries '
                'no image sizes, so the padded tokens are treated as real (the default, '
                "padding-sensitive path). Use the plugin's data preprocessor "
                "(model.data_preprocessor.type='PadAwareDetDataPreprocessor' in mmdet, "
                "'PadAwareSegDataPreProcessor' in mmseg) or call the backbone with "
                'real_hw=[(h, w), ...]', stacklevel=3)
        return real_grid_of(x, real_hw)

    @staticmethod
    def _stem_input(x: torch.Tensor, real):
        """The input with its padding zeroed (pad-aware mode), as the stem's own zero
        padding of an image alone; unchanged when ``real`` is None."""
        return x if real is None else real.zero_map(x)

    def _final_norm_to_last_out_norm(self, sd: dict) -> dict:
        """A released checkpoint's final norm initialises the last output norm."""
        last = self.num_stages - 1
        if self.out_norm and last in self.out_indices:
            for p in ('weight', 'bias'):
                if f'norm.{p}' in sd:
                    sd[f'stages.{last}.norm.{p}'] = sd.pop(f'norm.{p}')
        return sd

    def stage_modules(self) -> List[List[nn.Module]]:
        """[stem modules, stage-1 modules, ...] for ``frozen_stages``: the stem is the
        first stage's embedding (parameters count as modules here)."""
        return [self.stages[0].embed_modules()] + [[stage] for stage in self.stages]

    def _check_input(self, x) -> None:
        """Called first in ``forward``: ``x`` must be a non-empty float batch
        ``[B, in_channels, H, W]``; with ``check_finite``, also free of NaN / Inf
        (:func:`~.input_checks.check_input`)."""
        check_input(type(self).__name__, self.in_channels, x)
        self._check_finite(x, -1)

    def _check_finite(self, x: torch.Tensor, stage: int, unit: str = 'stage') -> None:
        """With ``check_finite``: raise when ``x`` holds NaN / Inf, naming where they first
        appeared (``stage`` -1: the input, 0: the stem / patch embedding, k: ``unit`` k).
        :meth:`run_stages` calls it after the stem and each stage; off, it costs nothing."""
        if self.check_finite:
            check_finite(type(self).__name__, x, stage, unit)

    def _init_from_scratch(self) -> None:
        """The authors' initialisation: truncated normal linears, unit norms."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if 'pos_embed' in name or 'cls_token' in name or 'bias_table' in name:
                nn.init.trunc_normal_(p, std=0.02)
