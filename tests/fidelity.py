"""Build our backbones from the reference fixtures' arch dicts (authors' argument names)."""
import os

import torch

DATA = os.path.join(os.path.dirname(__file__), 'data', 'reference')
FAMILIES = ('pvt', 'swin', 'cswin', 'deit')


def load_fixture(family):
    return torch.load(os.path.join(DATA, f'inline_{family}_mini.pt'), weights_only=True)


def backbone_cfg(family, arch, **overrides):
    """Our backbone config equivalent to the authors' constructor arguments ``arch``."""
    if family == 'pvt':
        cfg = dict(type='InLinePVT', block_types=arch['attn_type'], qkv_bias=arch['qkv_bias'],
                   arch=dict(embed_dims=arch['embed_dims'], num_heads=arch['num_heads'],
                             mlp_ratios=arch['mlp_ratios'], depths=arch['depths']),
                   norm_cfg=dict(type='LN', eps=arch['norm_eps']))
    elif family == 'swin':
        cfg = dict(type='InLineSwinTransformer', block_types=arch['attn_type'],
                   mlp_ratio=arch['mlp_ratio'], qkv_bias=arch['qkv_bias'],
                   arch=dict(embed_dim=arch['embed_dim'], depths=arch['depths'],
                             num_heads=arch['num_heads']))
    elif family == 'cswin':
        cfg = dict(type='InLineCSWinTransformer', block_types=arch['attn_type'],
                   split_size=arch['split_size'], mlp_ratio=arch['mlp_ratio'],
                   arch=dict(embed_dim=arch['embed_dim'], depths=arch['depth'],
                             num_heads=arch['num_heads']))
    else:
        cfg = dict(type='InLineDeiT', pretrain_img_size=arch['img_size'],
                   patch_size=arch['patch_size'], qkv_bias=arch['qkv_bias'],
                   out_indices=arch['out_blocks'],
                   arch=dict(embed_dim=arch['embed_dim'], depth=arch['depth'],
                             num_heads=arch['num_heads']))
    cfg.update(drop_path_rate=0.0)
    cfg.update(overrides)
    return cfg
