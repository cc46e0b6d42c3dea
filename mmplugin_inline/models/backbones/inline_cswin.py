"""InLine-CSWin: CSWin Transformer with whole-map InLine blocks and stripe softmax blocks."""
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmplugin_inline.core import nchw_to_nlc, pad_amount
from mmplugin_inline.models.layers import (
    ConvMerging,
    CSWinAttention,
    Stage,
    TransformerBlock,
    build_norm,
)
from mmplugin_inline.weights import rename_keys

from .base import InLineBackbone, resolve_arch
from .legacy_keys import stage_renames


class ConvStem(nn.Sequential):
    """``Conv2d(7x7, stride 4, pad 2)`` -> tokens -> norm (the authors' ``stage1_conv_embed``).

    The input is first zero-padded to a multiple of 4 at the bottom / right, so the
    output is ``ceil(H / 4) x ceil(W / 4)`` like the other families (no-op at sizes
    divisible by 4, where it matches the authors' stem exactly).
    """
    stride = 4

    def __init__(self, in_channels, dim, norm_cfg):
        super().__init__(nn.Conv2d(in_channels, dim, 7, 4, 2), nn.Identity(),
                         build_norm(norm_cfg, dim))
        self.in_channels = in_channels

    def forward(self, x, hw=None):
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'expected an input of shape [B, {self.in_channels}, H, W], got '
                             f'{tuple(x.shape)}')
        x = self[0](F.pad(x, (0, pad_amount(x.shape[3], 4), 0, pad_amount(x.shape[2], 4))))
        hw = (x.shape[2], x.shape[3])
        return self[2](nchw_to_nlc(x)), hw


class InLineCSWinNet(InLineBackbone):
    """InLine-CSWin backbone (Han et al., NeurIPS 2024) for dense prediction.

    Conv stem (7x7 stride 4), four stages joined by conv merging (3x3 stride 2). InLine
    blocks ('I') and plain linear blocks ('L') attend over the whole map in one branch;
    softmax blocks ('S') use
    CSWin's cross-shaped stripes of width ``split_size[i]`` in two half-channel branches
    (one whole-map branch in the last stage). Both add LePE (3x3 depthwise conv on V).
    Stripes are padded to whole widths inside and padded keys are masked.

    Args:
        arch (str | dict): 't', 's', 'b' (InLine-CSWin), 'cswin-t', 'cswin-s', 'cswin-b'
            (the paper's softmax baselines, CSWin-T / S / B: other depths, softmax blocks)
            or a dict with ``embed_dim``, ``depths``, ``num_heads`` (``block_types``
            optional).
        in_channels (int): Default: 3.
        block_types (str, optional): one letter per stage, 'I', 'S' or 'L'; None takes the
            arch's ('IISS', or 'SSSS' for the baselines). Default: None.
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
        # the paper's softmax baselines (CSWin-T / S / B): other depths, softmax blocks
        'cswin-t': dict(embed_dim=64, depths=[1, 2, 21, 1], num_heads=[2, 4, 8, 16],
                        block_types='SSSS'),
        'cswin-s': dict(embed_dim=64, depths=[2, 4, 32, 2], num_heads=[2, 4, 8, 16],
                        block_types='SSSS'),
        'cswin-b': dict(embed_dim=96, depths=[2, 4, 32, 2], num_heads=[4, 8, 16, 32],
                        block_types='SSSS'),
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

    def __init__(self, arch='t', in_channels=3, block_types=None, kernel=None,
                 split_size=(1, 2, 7, 7), mlp_ratio=4.0, qkv_bias=True, drop_rate=0.0,
                 drop_path_rate=0.2, out_indices=(0, 1, 2, 3), out_norm=True,
                 norm_cfg=dict(type='LN'), act_cfg=dict(type='GELU'), local_residual=True,
                 **contract):
        super().__init__(in_channels=in_channels, **contract)
        cfg = resolve_arch(arch, self.arch_settings, type(self).__name__,
                           ('embed_dim', 'depths', 'num_heads'))
        depths = cfg['depths']
        dims, types, dpr = self._init_pyramid(cfg, out_indices,
                                              block_types or cfg.get('block_types', 'IISS'),
                                              drop_path_rate)
        self.stages = nn.ModuleList()
        for i in range(len(depths)):
            last = i == self.num_stages - 1
            # the conv stem (7x7 stride 4, padded to a multiple of 4: ceil(size / 4)) before
            # the first stage, a 3x3 conv of stride 2 (ceil(size / 2)) before the others;
            # built before the blocks (the seeded initialisation depends on the order)
            downsample = ConvStem(in_channels, dims[0], norm_cfg) if i == 0 else \
                ConvMerging(dims[i - 1], dims[i], norm_cfg)
            blocks = [TransformerBlock(
                dims[i],
                CSWinAttention(dims[i], cfg['num_heads'][i], t, split_size[i], last_stage=last,
                               qkv_bias=qkv_bias, kernel=kernel, proj_drop=drop_rate,
                               local_residual=local_residual),
                mlp_ratio, dpr[i][j], drop_rate, norm_cfg, act_cfg)
                for j, t in enumerate(types[i])]
            self.stages.append(Stage(blocks, downsample))
        self._add_out_norms(out_norm, norm_cfg)
        self._link_stages()
        self._init_from_scratch()

    @classmethod
    def legacy_renames(cls, num_stages=None):
        """Release 0.1: ``stage1_conv_embed``, ``stage<i>`` (the blocks, from 1),
        ``merge<i>`` (before stage i + 1), output norms ``norm0`` ..."""
        return stage_renames([(r'^stage1_conv_embed\.', 'stages.0.downsample.'),
                              (r'^stage(\d+)\.', 'stages.{prev}.blocks.'),
                              (r'^merge(\d+)\.', 'stages.{n}.downsample.'),
                              (r'^norm(\d+)\.', 'stages.{n}.norm.')])

    @classmethod
    def checkpoint_filter(cls, sd: Dict[str, torch.Tensor],
                          model: Optional[InLineBackbone] = None) -> Dict[str, torch.Tensor]:
        """A released checkpoint to this backbone: the authors' CSWin keeps qkv / proj / attns
        in the block, ours in its attention (renamed, then the keys of release 0.1 upgraded,
        :meth:`legacy_renames`); given ``model``, the released final norm initialises its
        last output norm."""
        sd = rename_keys(sd, [(r'^(stage\d+\.\d+)\.(qkv|proj|attns)\.', r'\1.attn.\2.')])
        sd = cls.upgrade_legacy_keys(sd, model=model)
        return sd if model is None else model._final_norm_to_last_out_norm(sd)
