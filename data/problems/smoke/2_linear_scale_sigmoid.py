"""Linear layer, then multiplication by a constant scale factor, then sigmoid."""

import torch
import torch.nn as nn

LEVEL = 2

batch_size = 128
in_features = 512
out_features = 256
scale_factor = 0.5

SIZE_PRESETS = {"gpu": {"batch_size": 4096, "in_features": 4096, "out_features": 4096}}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale_factor: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale_factor = scale_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        x = x * self.scale_factor
        return torch.sigmoid(x)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale_factor]
