"""InLine-CSWin: CSWin Transformer with whole-map InLine blocks and stripe softmax blocks."""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer

from mmplugin_inline.core import nchw_to_nlc, pad_amount
from mmplugin_inline.models.layers import ConvMerging, CSWinAttention, TransformerBlock, run_blocks
from mmplugin_inline.registry import MODELS
from mmplugin_inline.weights import rename_keys

from .base import InLineBackbone, resolve_arch


class ConvStem(nn.Sequential):
    """``Conv2d(7x7, stride 4, pad 2)`` -> tokens -> norm (the authors' ``stage1_conv_embed``).

    The input is first zero-padded to a multiple of 4 at the bottom / right, so the
    output is ``ceil(H / 4) x ceil(W / 4)`` like the other families (no-op at sizes
    divisible by 4, where it matches the authors' stem exactly).
    """

    def __init__(self, in_channels, dim, norm_cfg):
        super().__init__(nn.Conv2d(in_channels, dim, 7, 4, 2), nn.Identity(),
                         build_norm_layer(norm_cfg, dim)[1])
        self.in_channels = in_channels

    def forward(self, x):
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'expected an input of shape [B, {self.in_channels}, H, W], got '
                             f'{tuple(x.shape)}')
        x = self[0](F.pad(x, (0, pad_amount(x.shape[3], 4), 0, pad_amount(x.shape[2], 4))))
        hw = (x.shape[2], x.shape[3])
        return self[2](nchw_to_nlc(x)), hw


@MODELS.register_module()
class InLineCSWinTransformer(InLineBackbone):
    """InLine-CSWin backbone (Han et al., NeurIPS 2024) for dense prediction.

    Conv stem (7x7 stride 4), four stages joined by conv merging (3x3 stride 2). InLine
    blocks ('I') and plain linear blocks ('L') attend over the whole map in one branch;
    softmax blocks ('S') use
    CSWin's cross-shaped stripes of width ``split_size[i]`` in two half-channel branches
    (one whole-map branch in the last stage). Both add LePE (3x3 depthwise conv on V).
    Stripes are padded to whole widths inside and padded keys are masked.

    Args:
        arch (str | dict): 't', 's', 'b' or a dict with ``embed_dim``, ``depths``,
            ``num_heads``.
        in_channels (int): Default: 3.
        block_types (str): one letter per stage, 'I', 'S' or 'L'. Default: 'IISS'.
        kernel (str, optional): feature map of the linear blocks (see
            :class:`InLineBackbone`). Default: None.
        local_residual (bool): linear blocks with their local residual (see
            :class:`InLineBackbone`). Default: True.
        split_size (Sequence[int]): softmax stripe widths. Default: (1, 2, 7, 7).
        mlp_ratio (float): Default: 4.
        qkv_bias (bool): Default: True.
        drop_rate (float): Default: 0.
        drop_path_rate (float): Default: 0.2.
        out_indices (Sequence[int]): Default: (0, 1, 2, 3).
        out_norm (bool): LayerNorm on each output. Default: True.
        frozen_stages, norm_eval, init_cfg, check_finite: see :class:`InLineBackbone`.
        with_cp (bool | str): see :class:`InLineBackbone`. Default: False.
        norm_cfg (dict): Default: ``dict(type='LN')``.
        pad_aware (bool): padded tokens kept out, per image (see :class:`InLineBackbone`).
            Default: False.

    Outputs: tuple of NCHW maps with ``embed_dim * 2**i`` channels at stride ``4 * 2**i``.
    """
    arch_settings = {
        't': dict(embed_dim=64, depths=[2, 4, 18, 1], num_heads=[2, 4, 8, 16]),
        's': dict(embed_dim=64, depths=[3, 6, 29, 2], num_heads=[2, 4, 8, 16]),
        'b': dict(embed_dim=96, depths=[3, 6, 29, 2], num_heads=[4, 8, 16, 32]),
    }
    short_name = 'inline_cswin'
    released_weights = {
        't': ('InLine-CSwin-T', 'https://cloud.tsinghua.edu.cn/f/49fa2ecc543647c4b970/?dl=1'),
        's': ('InLine-CSwin-S', 'https://cloud.tsinghua.edu.cn/f/59f4e65f776f4052b93c/?dl=1'),
        'b': ('InLine-CSwin-B', 'https://cloud.tsinghua.edu.cn/f/91e17121df284ae38521/?dl=1'),
    }
    checkpoint_signature = r'^stage1_conv_embed\.|^stage1\.\d+\.'

    @classmethod
    def config_from_authors_args(cls, args: dict) -> dict:
        """This backbone's arguments for the authors' model built with ``args`` (their
        constructor arguments: ``attn_type``, ``depth``, ...)."""
        return dict(block_types=args['attn_type'], split_size=args['split_size'],
                    mlp_ratio=args['mlp_ratio'],
                    arch=dict(embed_dim=args['embed_dim'], depths=args['depth'],
                              num_heads=args['num_heads']))

    def __init__(self, arch='t', in_channels=3, block_types='IISS', kernel=None,
                 split_size=(1, 2, 7, 7), mlp_ratio=4.0, qkv_bias=True, drop_rate=0.0,
                 drop_path_rate=0.2, out_indices=(0, 1, 2, 3), out_norm=True, frozen_stages=-1,
                 norm_eval=False, with_cp=False, norm_cfg=dict(type='LN'),
                 act_cfg=dict(type='GELU'), init_cfg=None, check_finite=False, pad_aware=False,
                 local_residual=True):
        super().__init__(frozen_stages, norm_eval, with_cp, init_cfg, in_channels,
                         check_finite, pad_aware)
        cfg = resolve_arch(arch, self.arch_settings, 'InLineCSWinTransformer',
                           ('embed_dim', 'depths', 'num_heads'))
        depths = cfg['depths']
        dims, types, dpr = self._init_pyramid(cfg, out_indices, block_types, drop_path_rate)
        self.stage1_conv_embed = ConvStem(in_channels, dims[0], norm_cfg)
        for i in range(len(depths)):
            last = i == self.num_stages - 1
            self.add_module(f'stage{i + 1}', nn.ModuleList([
                TransformerBlock(
                    dims[i],
                    CSWinAttention(dims[i], cfg['num_heads'][i], t, split_size[i], last_stage=last,
                                   qkv_bias=qkv_bias, kernel=kernel, proj_drop=drop_rate,
                                   local_residual=local_residual),
                    mlp_ratio, dpr[i][j], drop_rate, norm_cfg, act_cfg)
                for j, t in enumerate(types[i])]))
            if not last:
                self.add_module(f'merge{i + 1}', ConvMerging(dims[i], dims[i + 1], norm_cfg))
        self._add_out_norms(out_norm, norm_cfg)
        self._init_from_scratch()

    def stage_modules(self):
        groups = [[self.stage1_conv_embed]]
        for i in range(self.num_stages):
            merge = self.stage1_conv_embed if i == 0 else getattr(self, f'merge{i}')
            groups.append([getattr(self, f'stage{i + 1}'), merge] + self._out_norms_of(i))
        return groups

    @classmethod
    def checkpoint_filter(cls, sd: Dict[str, torch.Tensor],
                          model: Optional[InLineBackbone] = None) -> Dict[str, torch.Tensor]:
        """A released checkpoint to this backbone: the authors' CSWin keeps qkv / proj / attns
        in the block, ours in its attention (renamed); given ``model``, the released final
        norm initialises its last output norm."""
        sd = rename_keys(sd, [(r'^(stage\d+\.\d+)\.(qkv|proj|attns)\.', r'\1.attn.\2.')])
        return sd if model is None else model._final_norm_to_last_out_norm(sd)

    def forward(self, x: torch.Tensor, valid_hw=None) -> Tuple[torch.Tensor, ...]:
        """x: [B, C_in, H, W] -> tuple of NCHW maps (see class docstring); ``valid_hw``:
        each image's valid (h, w) in pad-aware mode (see :class:`InLineBackbone`)."""
        self._check_input(x)
        valid = self._valid_pixels(x, valid_hw)
        # the stem pads to a multiple of 4, then a 7x7 conv of stride 4: ceil(size / 4)
        x, hw = self.stage1_conv_embed(self._stem_input(x, valid))
        if valid is not None:
            valid = valid.down(4, hw)
        self._check_finite(x, 0)
        outs = []
        for i in range(max(self.out_indices) + 1):
            if i > 0:  # 3x3 conv of stride 2, padding 1: ceil(size / 2)
                x, hw = getattr(self, f'merge{i}')(x, hw)
                if valid is not None:
                    valid = valid.down(2, hw)
            x = run_blocks(getattr(self, f'stage{i + 1}'), x, hw, self.with_cp, valid)
            self._check_finite(x, i + 1)
            if i in self.out_indices:
                outs.append(self._output(i, x, hw, valid))
        return tuple(outs)
