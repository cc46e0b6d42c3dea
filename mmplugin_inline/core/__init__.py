"""InLine attention kernels and token plumbing: pure PyTorch, no OpenMMLab import.

Shapes are ``[B, heads, N, d]`` for attention inputs; see each function's docstring.
One fast function per attention variant (``<variant>_attention.py``), its explicit
N x N form in ``reference.py``; the feature maps phi in ``feature_maps.py``.
"""
from .fast_paths import fast_paths_enabled, reference_paths
from .feature_maps import FEATURE_MAPS, NONNEGATIVE_FEATURE_MAPS, get_feature_map
from .inline_attention import inline_attention
from .linear_attention import linear_attention
from .local_residual import (
                             depthwise_conv_taps,
                             local_residual,
                             local_residual_nhwc,
                             local_residual_reference,
                             local_residual_taps,
)
from .matmul_backend import cpu_linear_backend, set_cpu_linear_backend
from .reference import (
                             ATTENTION_WEIGHTS,
                             inline_attention_authors,
                             inline_attention_reference,
                             inline_attention_weights,
                             linear_attention_reference,
                             linear_attention_weights,
                             softmax_attention_reference,
                             softmax_attention_weights,
)
from .softmax_attention import softmax_attention
from .tokens import (
                             crop_to,
                             nchw_to_nlc,
                             nlc_to_nchw,
                             pad_amount,
                             pad_to_multiple,
                             stripe_partition,
                             stripe_reverse,
                             stripe_shape,
                             window_partition,
                             window_reverse,
)

__all__ = [
    'inline_attention', 'inline_attention_weights', 'inline_attention_reference',
    'inline_attention_authors', 'linear_attention', 'linear_attention_weights',
    'linear_attention_reference', 'softmax_attention', 'softmax_attention_weights',
    'softmax_attention_reference', 'local_residual', 'local_residual_nhwc',
    'local_residual_reference', 'local_residual_taps', 'depthwise_conv_taps',
    'fast_paths_enabled', 'reference_paths', 'FEATURE_MAPS', 'NONNEGATIVE_FEATURE_MAPS',
    'get_feature_map', 'nchw_to_nlc',
    'nlc_to_nchw', 'pad_amount',
    'pad_to_multiple', 'crop_to', 'window_partition', 'window_reverse', 'stripe_partition',
    'stripe_reverse', 'stripe_shape', 'ATTENTION_WEIGHTS', 'cpu_linear_backend',
    'set_cpu_linear_backend'
]
