"""Feature maps phi applied to queries and keys before linear / InLine attention.

The paper trains with the identity and also reports ReLU, LeakyReLU and exp(0.2 x).
The backbones and configs select one by name with their ``kernel=`` argument (the
paper's word); here they are called what they are, feature maps.
"""
from typing import Callable, Dict

import torch
import torch.nn.functional as F


def _exp_feature_map(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(0.2 * x)


FEATURE_MAPS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    'identity': lambda x: x,
    'relu': F.relu,
    'leakyrelu': F.leaky_relu,  # slope 0.01, as nn.LeakyReLU() in the authors' code
    'exp': _exp_feature_map,
}


#: the feature maps whose values are never negative: with them the sum normaliser of plain
#: linear attention, ``phi(q_i) . sum_j phi(k_j)``, cannot be negative (its ``eps`` keeps it
#: positive); identity and LeakyReLU can make it zero or negative
NONNEGATIVE_FEATURE_MAPS = ('relu', 'exp')


def get_feature_map(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return the feature map called ``name`` (one of :data:`FEATURE_MAPS`).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    try:
        return FEATURE_MAPS[name]
    except KeyError:
        raise ValueError(f'unknown attention kernel {name!r}: set kernel= (a backbone option) '
                         f'to one of {sorted(FEATURE_MAPS)}') from None
