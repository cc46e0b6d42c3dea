"""The linear layer of every block: ``nn.Linear`` on the faster CPU library."""
import torch
import torch.nn as nn

from mmplugin_inline.core.matmul_backend import linear


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, state-dict keys and initialisation) whose product
    runs through :func:`mmplugin_inline.core.matmul_backend.linear`: in oneDNN for CPU
    fp32 inputs on processors where it is the faster library, ``F.linear`` otherwise
    (CUDA, half precision, traced / compiled / exported graphs, reference paths)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
