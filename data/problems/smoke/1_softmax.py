"""Softmax over the last dimension of a 2-D tensor."""

import torch
import torch.nn as nn

LEVEL = 1

batch_size = 16
dim = 16384

SIZE_PRESETS = {"gpu": {"batch_size": 4096, "dim": 4096}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
