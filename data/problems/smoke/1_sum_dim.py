"""Sum of a 3-D tensor over one dimension (dim 1 by default), dropping that dimension."""

import torch
import torch.nn as nn

LEVEL = 1

batch_size = 16
dim1 = 128
dim2 = 128
reduce_dim = 1

SIZE_PRESETS = {"gpu": {"batch_size": 64, "dim1": 1024, "dim2": 1024}}


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
