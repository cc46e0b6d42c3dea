"""Layers shared by the InLine backbone families."""
from .attention import GlobalAttention, MultiHeadAttentionBase
from .attention_kinds import (ATTN_KINDS, ATTN_TYPES, INLINE, SOFTMAX, AttentionKind,
                              ResidualKernelPredictor, attention_kind, parse_block_types)
from .blocks import (WITH_CP_MODES, Mlp, TransformerBlock, check_with_cp, run_blocks,
                     stochastic_depth_rates)
from .linear import Linear
from .embed import ConvMerging, PatchEmbed, PatchMerging, contiguous_map, resize_pos_embed
from .padding import VALID_HW_ATTR, ValidGrid, place_pos_embed, valid_sizes_of
from .stripe_attention import CSWinAttention, CSWinBranch
from .window_attention import WindowAttention, relative_position_index, shifted_window_mask

__all__ = [
    'ATTN_KINDS', 'ATTN_TYPES', 'INLINE', 'SOFTMAX', 'AttentionKind', 'attention_kind',
    'parse_block_types', 'MultiHeadAttentionBase', 'GlobalAttention', 'ResidualKernelPredictor',
    'WindowAttention', 'relative_position_index', 'shifted_window_mask', 'CSWinAttention',
    'CSWinBranch', 'Linear', 'WITH_CP_MODES', 'check_with_cp', 'Mlp', 'TransformerBlock',
    'run_blocks', 'stochastic_depth_rates', 'ConvMerging', 'PatchEmbed', 'PatchMerging', 'contiguous_map',
    'resize_pos_embed', 'VALID_HW_ATTR', 'ValidGrid', 'place_pos_embed', 'valid_sizes_of'
]
