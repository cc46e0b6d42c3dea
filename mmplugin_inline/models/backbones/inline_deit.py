"""InLine-DeiT: a plain ViT with InLine attention, outputting maps of chosen blocks."""
from typing import Dict, Optional

import torch
import torch.nn as nn

from mmplugin_inline.logs import log
from mmplugin_inline.models.layers import (
    GlobalAttention,
    PatchEmbed,
    Stage,
    TransformerBlock,
    build_norm,
    parse_block_types,
    resize_pos_embed,
)

from .base import InLineBackbone, resolve_arch
from .legacy_keys import stage_renames


class InLineDeiTNet(InLineBackbone):
    """InLine-DeiT backbone (Han et al., NeurIPS 2024) for dense prediction.

    16x16 patches, a cls token and a learned position embedding (sized for
    ``pretrain_img_size``: 224 / 288 / 448 for t / s / b, resized bicubically to the
    input grid), 12 blocks (InLine by default; ``block_types`` selects softmax or plain
    linear attention, for all blocks or per block). The local residual acts on the patch
    tokens only.
    Outputs the patch-token maps after the blocks in ``out_indices`` (all stride 16);
    pair it with mmseg's ``MultiLevelNeck`` or :class:`SimpleFeaturePyramid`.

    Args:
        arch (str | dict): 't', 's', 'b' (InLine-DeiT), 'deit-t', 'deit-s', 'deit-b' (the
            paper's softmax baselines, DeiT-T / S / B: other widths and heads, softmax
            blocks) or a dict with ``embed_dim``, ``depth``, ``num_heads`` (``block_types``,
            ``pretrain_img_size`` optional).
        in_channels (int): Default: 3.
        patch_size (int): Default: 16.
        pretrain_img_size (int, optional): None takes the arch's training size.
        block_types (str, optional): one letter for every block ('I', 'S' or 'L'; 'M' +
            count for InLine then softmax, as the pyramids' stages) or one letter per block
            (e.g. 'IIIIIISSSSSS' for depth 12); None takes the arch's ('I', or 'S' for the
            baselines). ``arch='t', block_types='S'`` keeps InLine-DeiT-T's 6 heads: the
            paper's softmax DeiT-T (3 heads) is ``arch='deit-t'``. Default: None.
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
        # the paper's softmax baselines (DeiT-T / S / B: timm's vit_{tiny,small,base}_patch16_224),
        # whose widths and heads differ from the InLine presets of the same size
        'deit-t': dict(embed_dim=192, depth=12, num_heads=3, pretrain_img_size=224,
                       block_types='S'),
        'deit-s': dict(embed_dim=384, depth=12, num_heads=6, pretrain_img_size=224,
                       block_types='S'),
        'deit-b': dict(embed_dim=768, depth=12, num_heads=12, pretrain_img_size=224,
                       block_types='S'),
    }
    short_name = 'inline_deit'
    released_weights = {
        't': ('InLine-DeiT-T', 'https://cloud.tsinghua.edu.cn/f/1d6b8191ad6d4114b291/?dl=1'),
        's': ('InLine-DeiT-S', 'https://cloud.tsinghua.edu.cn/f/2f3898b07e9247f3beb3/?dl=1'),
        'b': ('InLine-DeiT-B', 'https://cloud.tsinghua.edu.cn/f/10bdd726d4b0435eb34e/?dl=1'),
    }
    checkpoint_signature = r'^blocks\.\d+\.attn\.'
    stage_unit = 'block'

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
                 norm_cfg=dict(type='LN', eps=1e-6), act_cfg=dict(type='GELU'),
                 block_types=None, local_residual=True, **contract):
        super().__init__(in_channels=in_channels, **contract)
        cfg = resolve_arch(arch, self.arch_settings, type(self).__name__,
                           ('embed_dim', 'depth', 'num_heads'))
        dim, depth = cfg['embed_dim'], cfg['depth']
        block_types = block_types or cfg.get('block_types', 'I')
        self.depth = depth
        size = pretrain_img_size or cfg.get('pretrain_img_size', 224)
        self.grid = (size // patch_size, size // patch_size)
        # one letter per block: the string read as `depth` one-block stages
        per_block = isinstance(block_types, str) and len(block_types) == depth
        letters = sum(parse_block_types(block_types, [1] * depth if per_block else [depth],
                                        type(self).__name__), [])
        # a plain ViT is a pyramid of one-block stages of one width: the first embeds
        # the patches, the cls token and the position embedding
        _, types, dpr = self._init_pyramid(
            dict(depths=[1] * depth, embed_dims=[dim] * depth), out_indices, ''.join(letters),
            drop_path_rate)
        self.stages = nn.ModuleList()
        for j in range(depth):
            # the embedding before the first block (built first: the seeded initialisation
            # depends on the order)
            embed = dict(downsample=PatchEmbed(in_channels, dim, patch_size), dim=dim,
                         pos_grid=self.grid, pos_mode='bicubic', cls_token=True,
                         drop=drop_rate) if j == 0 else {}
            block = TransformerBlock(
                dim, GlobalAttention(dim, cfg['num_heads'], types[j][0], qkv_bias, kernel,
                                     num_prefix=1, proj_drop=drop_rate,
                                     local_residual=local_residual),
                mlp_ratio, dpr[j][0], drop_rate, norm_cfg, act_cfg)
            self.stages.append(Stage([block], **embed))
        self.final_norm = final_norm
        if final_norm:
            if depth - 1 not in self.out_indices:
                raise ValueError(
                    f'{type(self).__name__}: final_norm=True normalises the output of the last '
                    f'block ({depth - 1}), but out_indices={self.out_indices} does not return '
                    f'it, so the norm would never be used; add {depth - 1} (or -1) to out_indices '
                    'or set final_norm=False')
            self.stages[-1].norm = build_norm(norm_cfg, dim)
        self._link_stages()
        self._init_from_scratch()

    @property
    def norm(self) -> Optional[nn.Module]:
        """The final norm (the released checkpoints' ``norm``), with ``final_norm`` only."""
        return self.stages[-1].norm

    @classmethod
    def legacy_renames(cls, num_stages=None):
        """Release 0.1 (and the authors' files): ``patch_embed``, ``cls_token``,
        ``pos_embed``, ``blocks.<j>``, the final norm ``norm`` (after the last block)."""
        renames = [(r'^patch_embed\.', 'stages.0.downsample.'),
                   (r'^(cls_token|pos_embed)$', 'stages.0.\\1'),
                   (r'^blocks\.(\d+)\.', 'stages.{n}.blocks.0.')]
        if num_stages:
            renames.append((r'^norm\.', f'stages.{num_stages - 1}.norm.'))
        return stage_renames(renames)

    @classmethod
    def checkpoint_filter(cls, sd: Dict[str, torch.Tensor],
                          model: Optional[InLineBackbone] = None) -> Dict[str, torch.Tensor]:
        """A released checkpoint to this backbone (the authors' keys are those of release
        0.1: :meth:`legacy_renames`), adapted to ``model`` when given.

        Resizes a position embedding trained at another size. Without ``final_norm`` the
        checkpoint's final norm (``norm.weight`` / ``norm.bias``) has no place in the model:
        it is dropped, and the drop logged, rather than reported as unexpected keys.
        """
        if model is not None and not model.final_norm:
            dropped = [k for k in ('norm.weight', 'norm.bias') if sd.pop(k, None) is not None]
            if dropped:
                log(f'{type(model).__name__}: dropped {", ".join(dropped)} of the '
                    'checkpoint: final_norm=False does not use a final norm')
        # the final norm goes to the last stage given the model (``legacy_renames``);
        # without it, it keeps its released name
        sd = cls.upgrade_legacy_keys(sd, model=model)
        if model is None:
            return sd
        pos = sd.get('stages.0.pos_embed')
        if pos is not None and pos.shape != model.stages[0].pos_embed.shape:
            side = int(round((pos.shape[1] - 1) ** 0.5))
            sd['stages.0.pos_embed'] = resize_pos_embed(pos, (side, side), model.grid,
                                                        num_prefix=1, mode='bicubic')
        return sd

    def forward_tokens(self, x: torch.Tensor, real_hw=None):
        """Run the model; return ([B, 1 + N, C] after each out block, grid (H', W'), final
        tokens)."""
        maps = self.run_stages(x, real_hw)
        return [maps[j].x for j in self.out_indices], maps[-1].hw, maps[-1].x
