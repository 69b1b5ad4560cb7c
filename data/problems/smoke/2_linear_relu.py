"""Linear layer (x @ W^T + b) followed by ReLU."""

import torch
import torch.nn as nn

LEVEL = 2

batch_size = 128
in_features = 512
out_features = 512

SIZE_PRESETS = {"gpu": {"batch_size": 4096, "in_features": 4096, "out_features": 4096}}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
