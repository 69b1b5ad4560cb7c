"""Reference CPU kernel for 3_mlp: one C++ linear (+ optional ReLU) kernel applied per layer."""

import torch
import torch.nn as nn

from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cstdint>
extern "C" void linear(const float* x, const float* w, const float* b, float* y,
                       int64_t m, int64_t k, int64_t n, int64_t relu) {
    #pragma omp parallel for
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            float acc = b[j];
            for (int64_t p = 0; p < k; ++p) acc += x[i * k + p] * w[j * k + p];
            y[i * n + j] = (relu && acc < 0.f) ? 0.f : acc;
        }
    }
}
""")


def _linear(x: torch.Tensor, layer: nn.Linear, relu: bool) -> torch.Tensor:
    w, b = layer.weight.contiguous(), layer.bias.contiguous()
    m, k = x.shape
    y = torch.empty(m, w.shape[0], dtype=x.dtype)
    lib.linear(x, w, b, y, m, k, w.shape[0], int(relu))
    return y


class ModelNew(nn.Module):
    def __init__(self, input_size: int, hidden1: int, hidden2: int, output_size: int):
        super().__init__()
        # same layers in the same order as Model, so a shared seed gives identical weights
        self.fc1 = nn.Linear(input_size, hidden1)
        self.fc2 = nn.Linear(hidden1, hidden2)
        self.fc3 = nn.Linear(hidden2, output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _linear(x.contiguous(), self.fc1, relu=True)
        x = _linear(x, self.fc2, relu=True)
        return _linear(x, self.fc3, relu=False)
