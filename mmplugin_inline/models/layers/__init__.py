"""Layers shared by the InLine backbone families."""
from .attention import GlobalAttention, MultiHeadAttentionBase
from .blocks import (
                     WITH_CP_MODES,
                     Mlp,
                     TransformerBlock,
                     check_with_cp,
                     run_blocks,
                     stochastic_depth_rates,
)
from .embed import ConvMerging, PatchEmbed, PatchMerging, contiguous_map, resize_pos_embed
from .factories import build_act, build_norm
from .linear import Linear
from .mixers import (
                     MIXERS,
                     Group,
                     InLineMixer,
                     LinearCostMixer,
                     LinearMixer,
                     Mixer,
                     ResidualKernelPredictor,
                     SoftmaxMixer,
                     build_mixer,
                     check_heads,
                     describe_attn_types,
                     masked_mean,
                     mixer_class,
                     parse_block_types,
)
from .padding import REAL_HW_ATTR, RealGrid, place_pos_embed, real_grid_of
from .stage import Stage, TokenMap
from .stripe_attention import CSWinAttention, CSWinBranch
from .window_attention import (
                     WindowAttention,
                     WindowGrid,
                     relative_position_index,
                     shifted_window_mask,
)

__all__ = [
    'MIXERS', 'Mixer', 'Group', 'masked_mean', 'Stage', 'TokenMap', 'InLineMixer',
    'LinearMixer', 'SoftmaxMixer', 'LinearCostMixer',
    'build_mixer', 'mixer_class', 'describe_attn_types', 'check_heads', 'parse_block_types',
    'ResidualKernelPredictor', 'MultiHeadAttentionBase', 'GlobalAttention', 'WindowAttention',
    'WindowGrid', 'relative_position_index', 'shifted_window_mask', 'CSWinAttention',
    'CSWinBranch', 'Linear', 'WITH_CP_MODES', 'check_with_cp', 'Mlp', 'TransformerBlock',
    'run_blocks', 'stochastic_depth_rates', 'ConvMerging', 'PatchEmbed', 'PatchMerging',
    'contiguous_map', 'resize_pos_embed', 'REAL_HW_ATTR', 'RealGrid', 'place_pos_embed',
    'real_grid_of', 'build_norm', 'build_act'
]
