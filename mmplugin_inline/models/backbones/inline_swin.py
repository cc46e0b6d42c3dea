"""InLine-Swin: Swin Transformer whose InLine blocks attend over the whole map."""
from typing import Dict, Optional

import torch
import torch.nn as nn
from timm.layers import resize_rel_pos_bias_table_simple

from mmplugin_inline.models.layers import (
    GlobalAttention,
    PatchEmbed,
    PatchMerging,
    Stage,
    TransformerBlock,
    WindowAttention,
    mixer_class,
)

from .base import InLineBackbone, resolve_arch
from .legacy_keys import stage_renames


def swin_attention(letter, dim, num_heads, qkv_bias, kernel, window_size, shift, inline_window,
                   proj_drop, local_residual=True):
    """The attention layer of one block whose block letter is ``letter``.

    A mixer whose cost is quadratic in the tokens (softmax) attends in windows of
    ``window_size``, shifted by half a window when ``shift``. One whose cost is linear
    (InLine, plain linear) attends over the whole map, or in unshifted windows of
    ``inline_window`` (the ablation).
    """
    if not mixer_class(letter).linear_in_tokens:
        return WindowAttention(dim, num_heads, letter, qkv_bias, window_size=window_size,
                               shift=shift, proj_drop=proj_drop)
    if inline_window:
        return WindowAttention(dim, num_heads, letter, qkv_bias, kernel, window_size=inline_window,
                               proj_drop=proj_drop, local_residual=local_residual)
    return GlobalAttention(dim, num_heads, letter, qkv_bias, kernel, proj_drop=proj_drop,
                           local_residual=local_residual)


class InLineSwinNet(InLineBackbone):
    """InLine-Swin backbone (Han et al., NeurIPS 2024) for dense prediction.

    Patch embedding (4x4, LayerNorm), four stages joined by patch merging. InLine
    blocks ('I') were trained with a 56 window at 224 input, i.e. global attention
    without shift; here they (and plain linear blocks, 'L') attend over the whole map at
    every resolution (linear cost), or in windows of ``inline_window`` for ablations.
    Softmax blocks ('S') are Swin's W-MSA / SW-MSA: window 7, relative position bias,
    shift 3 on odd blocks.

    Args:
        arch (str | dict): 't', 's', 'b' or a dict with ``embed_dim``, ``depths``,
            ``num_heads`` (``block_types`` optional).
        in_channels (int): Default: 3.
        block_types (str, optional): per stage 'I' / 'S' / 'L' / 'M' + count; None takes
            the arch's ('IIIS', 'IISS', 'IIMS2' for t, s, b).
        kernel (str, optional): feature map of the linear blocks (see
            :class:`InLineBackbone`). Default: None.
        local_residual (bool): linear blocks with their local residual (see
            :class:`InLineBackbone`). Default: True.
        window_size (int): softmax window. Default: 7.
        inline_window (int, optional): run InLine blocks in windows of this size.
        mlp_ratio (float): Default: 4.
        qkv_bias (bool): Default: True.
        drop_rate (float): Default: 0.
        drop_path_rate (float): Default: 0.2.
        out_indices (Sequence[int]): Default: (0, 1, 2, 3).
        out_norm (bool): LayerNorm on each output (the final norm of a released
            checkpoint initialises the last). Default: True.
        frozen_stages, norm_eval, init_cfg, check_finite: see :class:`InLineBackbone`.
        with_cp (bool | str): see :class:`InLineBackbone`. Default: False.
        norm_cfg (dict): Default: ``dict(type='LN')``.
        pad_aware (bool): padded tokens kept out, per image (see :class:`InLineBackbone`);
            shifted windows follow each image's own size. Default: False.

    Outputs: tuple of NCHW maps with ``embed_dim * 2**i`` channels at stride ``4 * 2**i``.
    """
    arch_settings = {
        't': dict(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], block_types='IIIS'),
        's': dict(embed_dim=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24],
                  block_types='IISS'),
        'b': dict(embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                  block_types='IIMS2'),
    }
    short_name = 'inline_swin'
    released_weights = {
        't': ('InLine-Swin-T', 'https://cloud.tsinghua.edu.cn/f/32810869fcc34410966b/?dl=1'),
        's': ('InLine-Swin-S', 'https://cloud.tsinghua.edu.cn/f/e9657fd247c04c7cb1a1/?dl=1'),
        'b': ('InLine-Swin-B', 'https://cloud.tsinghua.edu.cn/f/bf23564bb64c420aafe1/?dl=1'),
    }
    checkpoint_signature = r'^layers\.\d+\.blocks\.'
    checkpoint_buffers = r'(^|\.)attn_mask$|relative_position_index$'  # rebuilt per forward

    @classmethod
    def config_from_authors_args(cls, args: dict) -> dict:
        """This backbone's arguments for the authors' model built with ``args`` (their
        constructor arguments: ``attn_type``, ``embed_dim``, ...)."""
        return dict(block_types=args['attn_type'], mlp_ratio=args['mlp_ratio'],
                    qkv_bias=args['qkv_bias'],
                    arch=dict(embed_dim=args['embed_dim'], depths=args['depths'],
                              num_heads=args['num_heads']))

    def __init__(self, arch='t', in_channels=3, block_types=None, kernel=None, window_size=7,
                 inline_window=None, mlp_ratio=4.0, qkv_bias=True, drop_rate=0.0,
                 drop_path_rate=0.2, out_indices=(0, 1, 2, 3), out_norm=True,
                 norm_cfg=dict(type='LN'), act_cfg=dict(type='GELU'), local_residual=True,
                 **contract):
        super().__init__(in_channels=in_channels, **contract)
        cfg = resolve_arch(arch, self.arch_settings, type(self).__name__,
                           ('embed_dim', 'depths', 'num_heads'))
        depths = cfg['depths']
        self.window_size = window_size
        dims, types, dpr = self._init_pyramid(
            cfg, out_indices, block_types or cfg.get('block_types', 'I' * len(depths)),
            drop_path_rate)
        self.stages = nn.ModuleList()
        for i in range(len(depths)):
            # the patch embedding before the first stage, merging before the others; built
            # before the blocks (the seeded initialisation depends on the order)
            downsample = PatchEmbed(in_channels, dims[0], 4, norm_cfg=norm_cfg) if i == 0 \
                else PatchMerging(dims[i - 1], norm_cfg)
            blocks = [TransformerBlock(dims[i], swin_attention(
                letter, dims[i], cfg['num_heads'][i], qkv_bias, kernel, window_size, j % 2 == 1,
                inline_window, drop_rate, local_residual), mlp_ratio, dpr[i][j], drop_rate,
                norm_cfg, act_cfg) for j, letter in enumerate(types[i])]
            self.stages.append(Stage(blocks, downsample, drop=drop_rate if i == 0 else None))
        self._add_out_norms(out_norm, norm_cfg)
        self._link_stages()
        self._init_from_scratch()

    @classmethod
    def legacy_renames(cls, num_stages=None):
        """Release 0.1 (and the authors' files): ``patch_embed``, ``layers.<i>.blocks``,
        the merging after stage i as ``layers.<i>.downsample``, output norms ``norm0`` ..."""
        return stage_renames([(r'^patch_embed\.', 'stages.0.downsample.'),
                              (r'^layers\.(\d+)\.blocks\.', 'stages.{n}.blocks.'),
                              (r'^layers\.(\d+)\.downsample\.', 'stages.{next}.downsample.'),
                              (r'^norm(\d+)\.', 'stages.{n}.norm.')])

    @classmethod
    def checkpoint_filter(cls, sd: Dict[str, torch.Tensor],
                          model: Optional[InLineBackbone] = None) -> Dict[str, torch.Tensor]:
        """A released checkpoint to this backbone (the authors' keys are those of release
        0.1, :meth:`legacy_renames`; its buffers, ``checkpoint_buffers``, are dropped
        before); given ``model``: final norm -> last output norm, relative position tables
        resized if needed."""
        sd = cls.upgrade_legacy_keys(sd, model=model)
        if model is None:
            return sd
        sd = model._final_norm_to_last_out_norm(sd)
        own = model.state_dict()
        for key, value in list(sd.items()):
            if key.endswith('relative_position_bias_table') and key in own \
                    and own[key].shape != value.shape:
                # timm's bicubic resampling of a flat [(2w-1)^2, heads] table
                sd[key] = resize_rel_pos_bias_table_simple(
                    value, (model.window_size, model.window_size), tuple(own[key].shape))
        return sd
