"""Exact (erf-based) GELU applied elementwise: y = 0.5 * x * (1 + erf(x / sqrt(2)))."""

import torch
import torch.nn as nn

LEVEL = 1

batch_size = 16
dim = 16384

SIZE_PRESETS = {"gpu": {"batch_size": 4096, "dim": 4096}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gelu = nn.GELU()  # approximate="none": the erf form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gelu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
