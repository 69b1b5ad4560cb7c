"""Dense matrix product C = A @ B of an (M, K) and a (K, N) matrix."""

import torch
import torch.nn as nn

LEVEL = 1

M = 256
K = 256
N = 256

SIZE_PRESETS = {"gpu": {"M": 4096, "K": 4096, "N": 4096}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
