"""InLine-DeiT: a plain ViT with InLine attention, outputting maps of chosen blocks."""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.logging import print_log

from mmplugin_inline.core import nlc_to_nchw
from mmplugin_inline.models.layers import (
    GlobalAttention,
    PatchEmbed,
    TransformerBlock,
    contiguous_map,
    parse_block_types,
    place_pos_embed,
    resize_pos_embed,
    run_blocks,
    stochastic_depth_rates,
)
from mmplugin_inline.registry import MODELS

from .base import InLineBackbone, normalize_out_indices, resolve_arch


@MODELS.register_module()
class InLineDeiT(InLineBackbone):
    """InLine-DeiT backbone (Han et al., NeurIPS 2024) for dense prediction.

    16x16 patches, a cls token and a learned position embedding (sized for
    ``pretrain_img_size``: 224 / 288 / 448 for t / s / b, resized bicubically to the
    input grid), 12 blocks (InLine by default; ``block_types`` selects softmax or plain
    linear attention, for all blocks or per block). The local residual acts on the patch
    tokens only.
    Outputs the patch-token maps after the blocks in ``out_indices`` (all stride 16);
    pair it with mmseg's ``MultiLevelNeck`` or :class:`SimpleFeaturePyramid`.

    Args:
        arch (str | dict): 't', 's', 'b' or a dict with ``embed_dim``, ``depth``, ``num_heads``.
        in_channels (int): Default: 3.
        patch_size (int): Default: 16.
        pretrain_img_size (int, optional): None takes the arch's training size.
        block_types (str): one letter for every block ('I', 'S' or 'L'; 'M' + count for
            InLine then softmax, as the pyramids' stages) or one letter per block (e.g.
            'IIIIIISSSSSS' for depth 12). Default: 'I'.
        kernel (str, optional): feature map of the linear blocks (see
            :class:`InLineBackbone`). Default: None.
        local_residual (bool): linear blocks with their local residual (see
            :class:`InLineBackbone`). Default: True.
        mlp_ratio (float): Default: 4.
        qkv_bias (bool): Default: True.
        drop_rate (float): Default: 0.
        drop_path_rate (float): Default: 0.1.
        out_indices (Sequence[int]): blocks whose output is returned. Default: (3, 5, 7, 11).
        final_norm (bool): apply the final LayerNorm (``norm``, the released checkpoints'
            last norm) to the output of the last block. Only with ``final_norm=True`` is
            ``norm`` built, so that every parameter is used (as DDP with
            ``find_unused_parameters=False`` needs); then the last block (``depth - 1``,
            or -1) must be among ``out_indices``, else a ValueError says so rather than
            building a norm that is never applied. With False, a checkpoint's
            ``norm.weight`` / ``norm.bias`` are dropped on loading, and the drop is
            logged. Default: False.
        frozen_stages (int): 0 freezes the patch embedding, cls token and position
            embedding; k also the first k blocks. Default: -1.
        norm_eval, init_cfg, check_finite: see :class:`InLineBackbone`
            (``check_finite`` counts blocks: block k is ``blocks[k - 1]``).
        with_cp (bool | str): see :class:`InLineBackbone`. Default: False.
        norm_cfg (dict): Default: ``dict(type='LN', eps=1e-6)``.
        pad_aware (bool): padded tokens kept out, per image (see :class:`InLineBackbone`);
            the cls token counts as real, and the position embedding is resized to each
            image's own grid. Default: False.
    """
    arch_settings = {
        't': dict(embed_dim=192, depth=12, num_heads=6, pretrain_img_size=224),
        's': dict(embed_dim=320, depth=12, num_heads=10, pretrain_img_size=288),
        'b': dict(embed_dim=384, depth=12, num_heads=12, pretrain_img_size=448),
    }
    short_name = 'inline_deit'
    released_weights = {
        't': ('InLine-DeiT-T', 'https://cloud.tsinghua.edu.cn/f/1d6b8191ad6d4114b291/?dl=1'),
        's': ('InLine-DeiT-S', 'https://cloud.tsinghua.edu.cn/f/2f3898b07e9247f3beb3/?dl=1'),
        'b': ('InLine-DeiT-B', 'https://cloud.tsinghua.edu.cn/f/10bdd726d4b0435eb34e/?dl=1'),
    }
    checkpoint_signature = r'^blocks\.\d+\.attn\.'

    @classmethod
    def config_from_authors_args(cls, args: dict) -> dict:
        """This backbone's arguments for the authors' model built with ``args`` (their
        constructor arguments: ``img_size``, ``patch_size``, ...)."""
        return dict(pretrain_img_size=args['img_size'], patch_size=args['patch_size'],
                    qkv_bias=args['qkv_bias'],
                    arch=dict(embed_dim=args['embed_dim'], depth=args['depth'],
                              num_heads=args['num_heads']))

    def __init__(self, arch='s', in_channels=3, patch_size=16, pretrain_img_size=None,
                 kernel=None, mlp_ratio=4.0, qkv_bias=True, drop_rate=0.0,
                 drop_path_rate=0.1, out_indices=(3, 5, 7, 11), final_norm=False,
                 frozen_stages=-1, norm_eval=False, with_cp=False,
                 norm_cfg=dict(type='LN', eps=1e-6), act_cfg=dict(type='GELU'), init_cfg=None,
                 check_finite=False, pad_aware=False, block_types='I', local_residual=True):
        super().__init__(frozen_stages, norm_eval, with_cp, init_cfg, in_channels,
                         check_finite, pad_aware)
        cfg = resolve_arch(arch, self.arch_settings, 'InLineDeiT',
                           ('embed_dim', 'depth', 'num_heads'))
        dim, depth = cfg['embed_dim'], cfg['depth']
        self.embed_dims = dim
        self.depth = depth
        size = pretrain_img_size or cfg.get('pretrain_img_size', 224)
        self.grid = (size // patch_size, size // patch_size)
        self.out_indices = normalize_out_indices(out_indices, depth, 'InLineDeiT')
        self.patch_embed = PatchEmbed(in_channels, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.grid[0] * self.grid[1], dim))
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = stochastic_depth_rates([depth], drop_path_rate)[0]
        # one letter per block: the string read as `depth` one-block stages
        per_block = isinstance(block_types, str) and len(block_types) == depth
        letters = sum(parse_block_types(block_types, [1] * depth if per_block else [depth],
                                        'InLineDeiT'), [])
        self.blocks = nn.ModuleList([
            TransformerBlock(dim,
                             GlobalAttention(dim, cfg['num_heads'], letter, qkv_bias, kernel,
                                             num_prefix=1, proj_drop=drop_rate,
                                             local_residual=local_residual),
                             mlp_ratio, dpr[j], drop_rate, norm_cfg, act_cfg)
            for j, letter in enumerate(letters)])
        self.final_norm = final_norm
        if final_norm:
            if depth - 1 not in self.out_indices:
                raise ValueError(
                    'InLineDeiT: final_norm=True normalises the output of the last block '
                    f'({depth - 1}), but out_indices={self.out_indices} does not return it, so '
                    f'the norm would never be used; add {depth - 1} (or -1) to out_indices '
                    'or set final_norm=False')
            self.norm = build_norm_layer(norm_cfg, dim)[1]
        self._init_from_scratch()

    def stage_modules(self):
        stem = [self.patch_embed, self.cls_token, self.pos_embed]
        return [stem] + [stem + [blk] for blk in self.blocks]

    @classmethod
    def checkpoint_filter(cls, sd: Dict[str, torch.Tensor],
                          model: Optional[InLineBackbone] = None) -> Dict[str, torch.Tensor]:
        """A released checkpoint to this backbone (its keys are ours already), adapted to
        ``model`` when given.

        Resizes a position embedding trained at another size. Without ``final_norm`` the
        checkpoint's final norm (``norm.weight`` / ``norm.bias``) has no place in the model:
        it is dropped, and the drop logged, rather than reported as unexpected keys.
        """
        if model is None:
            return sd
        if not model.final_norm:
            dropped = [k for k in ('norm.weight', 'norm.bias') if sd.pop(k, None) is not None]
            if dropped:
                print_log(f'InLineDeiT: dropped {", ".join(dropped)} of the checkpoint: '
                          'final_norm=False does not use a final norm', logger='current')
        pos = sd.get('pos_embed')
        if pos is not None and pos.shape != model.pos_embed.shape:
            side = int(round((pos.shape[1] - 1) ** 0.5))
            sd['pos_embed'] = resize_pos_embed(pos, (side, side), model.grid, num_prefix=1,
                                               mode='bicubic')
        return sd

    def forward_tokens(self, x: torch.Tensor, valid_hw=None):
        """Run the model; return ([B, 1 + N, C] after each out block, grid (H', W'), final)."""
        return self._run(x, valid_hw)[:3]

    def _run(self, x: torch.Tensor, valid_hw=None):
        """:meth:`forward_tokens`, plus the token grid of pad-aware mode (or None)."""
        self._check_input(x)
        valid = self._valid_pixels(x, valid_hw)
        x, hw = self.patch_embed(self._stem_input(x, valid))
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if valid is None:
            pos = resize_pos_embed(self.pos_embed, self.grid, hw, num_prefix=1, mode='bicubic')
        else:  # each image's own grid, placed into the canvas
            valid = valid.down(self.patch_embed.patch_size, hw)
            pos = place_pos_embed(self.pos_embed, self.grid, valid, resize_pos_embed,
                                  num_prefix=1, mode='bicubic')
        x = self.pos_drop(x + pos)
        self._check_finite(x, 0)
        outs = []
        for j in range(max(self.out_indices) + 1):
            x = run_blocks(self.blocks[j:j + 1], x, hw, self.with_cp, valid)
            self._check_finite(x, j + 1, 'block')
            if j in self.out_indices:
                outs.append(x)
        return outs, hw, x, valid

    def forward(self, x: torch.Tensor, valid_hw=None) -> Tuple[torch.Tensor, ...]:
        """x: [B, C_in, H, W] -> tuple of [B, embed_dim, ceil(H/16), ceil(W/16)];
        ``valid_hw``: each image's valid (h, w) in pad-aware mode (see
        :class:`InLineBackbone`)."""
        outs, hw, _, valid = self._run(x, valid_hw)
        maps = []
        for j, tokens in zip(self.out_indices, outs):
            if self.final_norm and j == self.depth - 1:
                tokens = self.norm(tokens)
            tokens = tokens[:, 1:]
            if valid is not None:
                tokens = valid.zero(tokens)
            maps.append(contiguous_map(nlc_to_nchw(tokens, hw)))
        return tuple(maps)
