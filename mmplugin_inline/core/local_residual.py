"""The dynamic depthwise local residual of InLine attention.

V, laid out as an image, is convolved with a 3x3 depthwise kernel that differs for
every sample and channel (predicted elsewhere from the mean token). Zero padding.
"""
import torch
import torch.nn.functional as F


def local_residual(v_map: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-sample depthwise 3x3 convolution.

    Args:
        v_map (Tensor): values as an image, [B, C, H, W] (any H, W).
        weights (Tensor): one 3x3 kernel per sample and channel, [B, C, 3, 3].

    Returns:
        Tensor: [B, C, H, W].
    """
    b, c, h, w = v_map.shape
    if weights.shape != (b, c, 3, 3):
        raise ValueError(f'weights must be [B, C, 3, 3] = [{b}, {c}, 3, 3] for v_map of shape '
                         f'{tuple(v_map.shape)}, got {tuple(weights.shape)}')
    # one group per (sample, channel): a batched depthwise conv in a single call
    out = F.conv2d(v_map.reshape(1, b * c, h, w), weights.reshape(b * c, 1, 3, 3).to(v_map.dtype),
                   padding=1, groups=b * c)
    return out.view(b, c, h, w)


def local_residual_reference(v_map: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The same convolution as a loop over samples (the check of :func:`local_residual`)."""
    return torch.cat([
        F.conv2d(v_map[i:i + 1], weights[i].unsqueeze(1), padding=1, groups=v_map.shape[1])
        for i in range(v_map.shape[0])
    ])
