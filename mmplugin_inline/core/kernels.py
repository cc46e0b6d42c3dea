"""Feature maps phi applied to queries and keys before linear / InLine attention.

The paper trains with the identity and also reports ReLU, LeakyReLU and exp(0.2 x).
"""
from typing import Callable, Dict

import torch
import torch.nn.functional as F


def _exp_kernel(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(0.2 * x)


KERNELS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    'identity': lambda x: x,
    'relu': F.relu,
    'leakyrelu': F.leaky_relu,  # slope 0.01, as nn.LeakyReLU() in the authors' code
    'exp': _exp_kernel,
}


def get_kernel(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return the feature map called ``name`` (one of :data:`KERNELS`).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f'unknown attention kernel {name!r}; expected one of '
                         f'{sorted(KERNELS)}') from None
