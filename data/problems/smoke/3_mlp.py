"""Three-layer MLP: Linear -> ReLU -> Linear -> ReLU -> Linear."""

import torch
import torch.nn as nn

LEVEL = 3

batch_size = 64
input_size = 512
hidden1 = 512
hidden2 = 256
output_size = 128

SIZE_PRESETS = {"gpu": {"batch_size": 1024, "input_size": 4096, "hidden1": 4096, "hidden2": 2048, "output_size": 1024}}


class Model(nn.Module):
    def __init__(self, input_size: int, hidden1: int, hidden2: int, output_size: int):
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden1)
        self.fc2 = nn.Linear(hidden1, hidden2)
        self.fc3 = nn.Linear(hidden2, output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def get_inputs():
    return [torch.randn(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden1, hidden2, output_size]
