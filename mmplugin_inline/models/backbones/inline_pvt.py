"""InLine-PVT: the Pyramid Vision Transformer with InLine attention at full resolution."""
from typing import Dict, Optional

import torch
import torch.nn as nn

from mmplugin_inline.models.layers import (
    GlobalAttention,
    PatchEmbed,
    Stage,
    TransformerBlock,
    mixer_class,
    resize_pos_embed,
)

from .base import InLineBackbone, resolve_arch
from .legacy_keys import stage_renames

_COMMON = dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], mlp_ratios=[8, 8, 4, 4],
               sr_ratios=[8, 4, 2, 1])


class InLinePVTNet(InLineBackbone):
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
        arch (str | dict): 't', 's', 'm', 'l' (InLine-PVT), 'pvt-t', 'pvt-s', 'pvt-m',
            'pvt-l' (the paper's softmax baselines, PVT-T ... L: other head counts, softmax
            blocks) or a dict with ``embed_dims``, ``num_heads``, ``mlp_ratios``,
            ``depths`` (``sr_ratios``, ``block_types`` optional).
        in_channels (int): input channels. Default: 3.
        block_types (str, optional): one letter per stage, 'I', 'S' or 'L' (see
            :func:`~mmplugin_inline.models.layers.parse_block_types`); None takes the
            arch's ('IIII', or 'SSSS' for the baselines). Default: None.
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
        # the paper's softmax baselines (PVT-T / S / M / L): half the heads, softmax blocks
        **{f'pvt-{k}': dict(_COMMON, num_heads=[1, 2, 5, 8], depths=d, block_types='SSSS')
           for k, d in (('t', [2, 2, 2, 2]), ('s', [3, 4, 6, 3]), ('m', [3, 4, 18, 3]),
                        ('l', [3, 8, 27, 3]))},
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

    def __init__(self, arch='t', in_channels=3, block_types=None, kernel=None,
                 pretrain_img_size=224, qkv_bias=True, drop_rate=0.0, drop_path_rate=0.1,
                 out_indices=(0, 1, 2, 3), out_norm=True, norm_cfg=dict(type='LN', eps=1e-6),
                 act_cfg=dict(type='GELU'), local_residual=True, **contract):
        super().__init__(in_channels=in_channels, **contract)
        cfg = resolve_arch(arch, self.arch_settings, type(self).__name__,
                           ('embed_dims', 'num_heads', 'mlp_ratios', 'depths'))
        sr_ratios = cfg.get('sr_ratios', _COMMON['sr_ratios'])
        dims, types, dpr = self._init_pyramid(cfg, out_indices,
                                              block_types or cfg.get('block_types', 'IIII'),
                                              drop_path_rate)
        self.stages = nn.ModuleList()
        for i in range(self.num_stages):
            patch, grid = (4 if i == 0 else 2), pretrain_img_size // (4 * 2 ** i)
            # built before the blocks: the seeded initialisation depends on the order
            embed = PatchEmbed(in_channels if i == 0 else dims[i - 1], dims[i], patch,
                               norm_cfg=dict(type='LN'))
            blocks = [TransformerBlock(
                dims[i],
                GlobalAttention(dims[i], cfg['num_heads'][i], attn_type=t, qkv_bias=qkv_bias,
                                kernel=kernel, separate_q=True,
                                # a quadratic mixer (softmax) reduces its keys
                                sr_ratio=1 if mixer_class(t).linear_in_tokens else sr_ratios[i],
                                proj_drop=drop_rate, local_residual=local_residual),
                mlp_ratio=cfg['mlp_ratios'][i], drop_path=dpr[i][j], drop=drop_rate,
                norm_cfg=norm_cfg, act_cfg=act_cfg) for j, t in enumerate(types[i])]
            self.stages.append(Stage(blocks, embed, dims[i], pos_grid=(grid, grid), drop=drop_rate))
        self._add_out_norms(out_norm, norm_cfg)
        self._link_stages()
        self._init_from_scratch()

    @classmethod
    def legacy_renames(cls, num_stages=None):
        """Release 0.1 (and the authors' files): ``patch_embed1``, ``pos_embed1``,
        ``block1`` per stage, output norms ``norm0`` ...: the stages counted from 1."""
        return stage_renames([(r'^patch_embed(\d+)\.', 'stages.{prev}.downsample.'),
                              (r'^pos_embed(\d+)$', 'stages.{prev}.pos_embed'),
                              (r'^block(\d+)\.', 'stages.{prev}.blocks.'),
                              (r'^norm(\d+)\.', 'stages.{n}.norm.')])

    @classmethod
    def checkpoint_filter(cls, sd: Dict[str, torch.Tensor],
                          model: Optional[InLineBackbone] = None) -> Dict[str, torch.Tensor]:
        """A released checkpoint to this backbone (the authors' keys are those of release
        0.1: :meth:`legacy_renames`); given ``model``, its position embeddings resized to
        the model's grids."""
        sd = cls.upgrade_legacy_keys(sd, model=model)
        if model is None:
            return sd
        for i, stage in enumerate(model.stages):
            key, grid = f'stages.{i}.pos_embed', stage.pos_grid
            if key in sd and sd[key].shape[1] != grid[0] * grid[1]:
                side = int(round(sd[key].shape[1] ** 0.5))
                sd[key] = resize_pos_embed(sd[key], (side, side), grid)
        return sd
