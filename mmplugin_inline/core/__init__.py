"""InLine attention kernels and token plumbing: pure PyTorch, no OpenMMLab import.

Shapes are ``[B, heads, N, d]`` for attention inputs; see each function's docstring.
"""
from .inline_attention import inline_attention
from .kernels import KERNELS, get_kernel
from .linear_attention import linear_attention, softmax_attention
from .local_residual import local_residual, local_residual_reference
from .reference import (inline_attention_authors, inline_attention_reference,
                        inline_attention_weights, linear_attention_reference,
                        linear_attention_weights, softmax_attention_reference,
                        softmax_attention_weights)
from .tokens import (crop_to, nchw_to_nlc, nlc_to_nchw, pad_amount, pad_to_multiple,
                     stripe_partition, stripe_reverse, stripe_shape, window_partition,
                     window_reverse)

#: name -> fast function with the (q, k, v, kernel=...) calling convention
ATTENTION_FUNCTIONS = {
    'inline': inline_attention,
    'linear': linear_attention,
    'softmax': softmax_attention,
}
#: name -> explicit N x N weights with the (q, k, kernel=...) calling convention
ATTENTION_WEIGHTS = {
    'inline': inline_attention_weights,
    'linear': linear_attention_weights,
    'softmax': softmax_attention_weights,
}

__all__ = [
    'inline_attention', 'inline_attention_weights', 'inline_attention_reference',
    'inline_attention_authors', 'linear_attention', 'linear_attention_weights',
    'linear_attention_reference', 'softmax_attention', 'softmax_attention_weights',
    'softmax_attention_reference', 'local_residual', 'local_residual_reference', 'KERNELS',
    'get_kernel', 'nchw_to_nlc', 'nlc_to_nchw', 'pad_amount', 'pad_to_multiple', 'crop_to',
    'window_partition', 'window_reverse', 'stripe_partition', 'stripe_reverse',
    'stripe_shape', 'ATTENTION_FUNCTIONS', 'ATTENTION_WEIGHTS'
]
