"""InLine-PVT: the Pyramid Vision Transformer with InLine attention at full resolution."""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

from mmplugin_inline.core import nlc_to_nchw
from mmplugin_inline.models.layers import (
    GlobalAttention,
    PatchEmbed,
    TransformerBlock,
    mixer_class,
    place_pos_embed,
    resize_pos_embed,
    run_blocks,
)
from mmplugin_inline.registry import MODELS

from .base import InLineBackbone, resolve_arch

_COMMON = dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], mlp_ratios=[8, 8, 4, 4],
               sr_ratios=[8, 4, 2, 1])


@MODELS.register_module()
class InLinePVT(InLineBackbone):
    """InLine-PVT backbone (Han et al., NeurIPS 2024) for dense prediction.

    Four stages of patch embedding (conv with kernel = stride = 4, then 2; LayerNorm), a
    learned position embedding per stage (sized for ``pretrain_img_size``, resized
    bilinearly to the input), and blocks. 'I' (InLine) and 'L' (plain linear) blocks
    attend with keys and values at full resolution; 'S' blocks are PVT's softmax
    spatial-reduction attention (sr ratios [8, 4, 2, 1]).

    Unlike the authors' classifier, each output gets a LayerNorm by default (as in
    PVTv2 and Swin for detection): the FPN then sees features of a fixed scale (the
    README's FAQ compares the two settings). The released checkpoints have no such
    norms: they start at weight 1, bias 0.

    Args:
        arch (str | dict): 't', 's', 'm', 'l' or a dict with ``embed_dims``,
            ``num_heads``, ``mlp_ratios``, ``depths`` (``sr_ratios`` optional).
        in_channels (int): input channels. Default: 3.
        block_types (str): one letter per stage, 'I', 'S' or 'L' (see
            :func:`~mmplugin_inline.models.layers.parse_block_types`). Default: 'IIII'.
        kernel (str, optional): feature map of the linear blocks (see
            :class:`InLineBackbone`). Default: None.
        local_residual (bool): linear blocks with their local residual (see
            :class:`InLineBackbone`). Default: True.
        pretrain_img_size (int): input size the position embeddings are sized for. Default: 224.
        qkv_bias (bool): Default: True.
        drop_rate (float): dropout after position embedding and in MLPs. Default: 0.
        drop_path_rate (float): stochastic depth, linear over blocks. Default: 0.1.
        out_indices (Sequence[int]): stages to output. Default: (0, 1, 2, 3).
        out_norm (bool): LayerNorm on each output; False gives the authors' raw stage
            outputs. Default: True.
        frozen_stages (int): see :class:`InLineBackbone`. Default: -1.
        norm_eval (bool): Default: False.
        with_cp (bool | str): see :class:`InLineBackbone`. Default: False.
        norm_cfg (dict): block norms. Default: ``dict(type='LN', eps=1e-6)``.
        init_cfg (dict, optional): e.g. ``dict(type='Pretrained', checkpoint=PATH)``.
        check_finite (bool): stop at the first NaN / Inf (see :class:`InLineBackbone`).
            Default: False.
        pad_aware (bool): padded tokens kept out, per image (see :class:`InLineBackbone`);
            the position embeddings are resized to each image's own grid. Default: False.

    Outputs: a tuple of NCHW maps, stage i with ``embed_dims[i]`` channels at stride
    ``4 * 2**i`` (size ``ceil``-divided; any input size).
    """
    arch_settings = {
        't': dict(_COMMON, depths=[2, 2, 2, 2]),
        's': dict(_COMMON, depths=[3, 4, 6, 3]),
        'm': dict(_COMMON, depths=[3, 4, 18, 3]),
        'l': dict(_COMMON, depths=[3, 8, 27, 3]),
    }
    short_name = 'inline_pvt'
    released_weights = {
        't': ('InLine-PVT-T', 'https://cloud.tsinghua.edu.cn/f/90ac52b1555b401eb5e6/?dl=1'),
        's': ('InLine-PVT-S', 'https://cloud.tsinghua.edu.cn/f/1ab953b2479d433080a3/?dl=1'),
        'm': ('InLine-PVT-M', 'https://cloud.tsinghua.edu.cn/f/a72aec31e6084bc0a280/?dl=1'),
        'l': ('InLine-PVT-L', 'https://cloud.tsinghua.edu.cn/f/efd91318ba964f01b288/?dl=1'),
    }
    checkpoint_signature = r'^pos_embed1$|^block1\.'

    @classmethod
    def config_from_authors_args(cls, args: dict) -> dict:
        """This backbone's arguments for the authors' model built with ``args`` (their
        constructor arguments: ``attn_type``, ``norm_eps``, ...)."""
        return dict(block_types=args['attn_type'], qkv_bias=args['qkv_bias'],
                    arch=dict(embed_dims=args['embed_dims'], num_heads=args['num_heads'],
                              mlp_ratios=args['mlp_ratios'], depths=args['depths']),
                    norm_cfg=dict(type='LN', eps=args['norm_eps']))

    def __init__(self, arch='t', in_channels=3, block_types='IIII', kernel=None,
                 pretrain_img_size=224, qkv_bias=True, drop_rate=0.0, drop_path_rate=0.1,
                 out_indices=(0, 1, 2, 3), out_norm=True, frozen_stages=-1, norm_eval=False,
                 with_cp=False, norm_cfg=dict(type='LN', eps=1e-6), act_cfg=dict(type='GELU'),
                 init_cfg=None, check_finite=False, pad_aware=False, local_residual=True):
        super().__init__(frozen_stages, norm_eval, with_cp, init_cfg, in_channels,
                         check_finite, pad_aware)
        cfg = resolve_arch(arch, self.arch_settings, 'InLinePVT',
                           ('embed_dims', 'num_heads', 'mlp_ratios', 'depths'))
        sr_ratios = cfg.get('sr_ratios', _COMMON['sr_ratios'])
        dims, types, dpr = self._init_pyramid(cfg, out_indices, block_types, drop_path_rate)
        self.pos_drop = nn.Dropout(drop_rate)
        self.grid_sizes = []
        for i in range(self.num_stages):
            patch = 4 if i == 0 else 2
            self.add_module(f'patch_embed{i + 1}', PatchEmbed(
                in_channels if i == 0 else dims[i - 1], dims[i], patch, norm_cfg=dict(type='LN')))
            grid = pretrain_img_size // (4 * 2 ** i)
            self.grid_sizes.append((grid, grid))
            self.register_parameter(f'pos_embed{i + 1}',
                                    nn.Parameter(torch.zeros(1, grid * grid, dims[i])))
            self.add_module(f'block{i + 1}', nn.ModuleList([
                TransformerBlock(
                    dims[i],
                    GlobalAttention(dims[i], cfg['num_heads'][i], attn_type=t, qkv_bias=qkv_bias,
                                    kernel=kernel, separate_q=True,
                                    # a quadratic mixer (softmax) reduces its keys
                                    sr_ratio=1 if mixer_class(t).linear_in_tokens
                                    else sr_ratios[i],
                                    proj_drop=drop_rate, local_residual=local_residual),
                    mlp_ratio=cfg['mlp_ratios'][i], drop_path=dpr[i][j], drop=drop_rate,
                    norm_cfg=norm_cfg, act_cfg=act_cfg) for j, t in enumerate(types[i])]))
        self._add_out_norms(out_norm, norm_cfg)
        self._init_from_scratch()

    def stage_modules(self):
        stages = [[getattr(self, f'patch_embed{i + 1}'), getattr(self, f'pos_embed{i + 1}'),
                   getattr(self, f'block{i + 1}')] + self._out_norms_of(i)
                  for i in range(self.num_stages)]
        return [stages[0][:2]] + stages

    @classmethod
    def checkpoint_filter(cls, sd: Dict[str, torch.Tensor],
                          model: Optional[InLineBackbone] = None) -> Dict[str, torch.Tensor]:
        """A released checkpoint to this backbone (its keys are ours already); given
        ``model``, its position embeddings resized to the model's grids."""
        if model is None:
            return sd
        for i, grid in enumerate(model.grid_sizes):
            key = f'pos_embed{i + 1}'
            if key in sd and sd[key].shape[1] != grid[0] * grid[1]:
                side = int(round(sd[key].shape[1] ** 0.5))
                sd[key] = resize_pos_embed(sd[key], (side, side), grid)
        return sd

    def forward(self, x: torch.Tensor, valid_hw=None) -> Tuple[torch.Tensor, ...]:
        """x: [B, C_in, H, W] -> tuple of [B, embed_dims[i], ~H/4/2**i, ~W/4/2**i].

        ``valid_hw``: each image's valid (h, w) in pad-aware mode (see
        :class:`InLineBackbone`).
        """
        self._check_input(x)
        valid = self._valid_pixels(x, valid_hw)
        x = self._stem_input(x, valid)
        outs = []
        for i in range(max(self.out_indices) + 1):  # later stages would be unused
            x, hw = getattr(self, f'patch_embed{i + 1}')(x)
            if i == 0:
                self._check_finite(x, 0)
            pos_embed = getattr(self, f'pos_embed{i + 1}')
            if valid is None:
                pos = resize_pos_embed(pos_embed, self.grid_sizes[i], hw)
            else:  # each image's own grid, placed into the canvas
                valid = valid.down(4 if i == 0 else 2, hw)
                pos = place_pos_embed(pos_embed, self.grid_sizes[i], valid, resize_pos_embed)
            x = run_blocks(getattr(self, f'block{i + 1}'), self.pos_drop(x + pos), hw,
                           self.with_cp, valid)
            self._check_finite(x, i + 1)
            if i in self.out_indices:
                outs.append(self._output(i, x, hw, valid))
            x = nlc_to_nchw(x, hw)
        return tuple(outs)
