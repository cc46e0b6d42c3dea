"""A simple feature pyramid for plain (single-stride) backbones, after ViTDet."""
from typing import Sequence, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule

from mmplugin_inline.models.layers import contiguous_map
from mmplugin_inline.registry import MODELS


class _ChannelsLastNorm(nn.Module):
    """A norm over channels applied to an NCHW map (LayerNorm as in ViTDet)."""

    def __init__(self, norm_cfg, channels):
        super().__init__()
        self.norm = build_norm_layer(norm_cfg, channels)[1]

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@MODELS.register_module()
class SimpleFeaturePyramid(BaseModule):
    """Build a stride 4 / 8 / 16 / 32 pyramid from the last stride-16 map of a plain ViT.

    Each scale: a resampling (two 2x transposed convs with a norm and GELU between, one
    2x transposed conv, identity, or 2x max-pool), then ``1x1 conv -> norm`` and
    ``3x3 conv -> norm`` to ``out_channels``. Optionally a stride-64 level by max-pool
    of the last (for RPNs with five levels).

    Args:
        in_channels (int): channels of the backbone map.
        out_channels (int): channels of every output.
        scale_factors (Sequence[float]): resampling per level. Default: (4, 2, 1, 0.5).
        num_outs (int): outputs; extra ones are stride-2 max-pools of the last. Default: 5.
        norm_cfg (dict): Default: ``dict(type='LN', eps=1e-6)`` (channels-last).
    """

    def __init__(self, in_channels: int, out_channels: int,
                 scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5), num_outs: int = 5,
                 norm_cfg=dict(type='LN', eps=1e-6), init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if num_outs < len(scale_factors):
            raise ValueError(f'num_outs={num_outs} is fewer than the {len(scale_factors)} scales')
        self.num_outs = num_outs
        self.stages = nn.ModuleList()
        for scale in scale_factors:
            if scale == 4.0:
                layers = [nn.ConvTranspose2d(in_channels, in_channels // 2, 2, 2),
                          _ChannelsLastNorm(norm_cfg, in_channels // 2), nn.GELU(),
                          nn.ConvTranspose2d(in_channels // 2, in_channels // 4, 2, 2)]
                width = in_channels // 4
            elif scale == 2.0:
                layers, width = [nn.ConvTranspose2d(in_channels, in_channels // 2, 2, 2)], \
                    in_channels // 2
            elif scale == 1.0:
                layers, width = [], in_channels
            elif scale == 0.5:
                layers, width = [nn.MaxPool2d(2, 2)], in_channels
            else:
                raise ValueError(f'scale factor {scale} is not one of 4, 2, 1, 0.5')
            layers += [nn.Conv2d(width, out_channels, 1, bias=False),
                       _ChannelsLastNorm(norm_cfg, out_channels),
                       nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                       _ChannelsLastNorm(norm_cfg, out_channels)]
            self.stages.append(nn.Sequential(*layers))

    def forward(self, inputs) -> Tuple[torch.Tensor, ...]:
        """inputs: a map or a tuple of maps (the last is used) -> ``num_outs`` maps."""
        x = inputs[-1] if isinstance(inputs, (tuple, list)) else inputs
        outs = [stage(x) for stage in self.stages]
        while len(outs) < self.num_outs:
            outs.append(nn.functional.max_pool2d(outs[-1], 1, stride=2))
        return tuple(contiguous_map(o) for o in outs)  # RoIAlign reads NCHW memory
