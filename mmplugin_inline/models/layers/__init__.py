"""Layers shared by the InLine backbone families."""
from .attention import (CSWinAttention, CSWinBranch, GlobalAttention, HeadMixer,
                        ResidualKernelPredictor, WindowAttention, relative_position_index,
                        shifted_window_mask)
from .blocks import (Mlp, TransformerBlock, parse_block_types, run_blocks,
                     stochastic_depth_rates)
from .embed import ConvMerging, PatchEmbed, PatchMerging, contiguous_map, resize_pos_embed

__all__ = [
    'CSWinAttention', 'CSWinBranch', 'GlobalAttention', 'HeadMixer', 'ResidualKernelPredictor',
    'WindowAttention', 'relative_position_index', 'shifted_window_mask', 'Mlp',
    'TransformerBlock', 'parse_block_types', 'run_blocks', 'stochastic_depth_rates',
    'ConvMerging', 'PatchEmbed', 'PatchMerging', 'contiguous_map', 'resize_pos_embed'
]
