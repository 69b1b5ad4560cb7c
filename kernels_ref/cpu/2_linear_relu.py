"""Reference CPU kernel for 2_linear_relu: y = max(x @ W^T + b, 0) in one pass."""

import torch
import torch.nn as nn

from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cstdint>
extern "C" void linear_relu(const float* x, const float* w, const float* b, float* y,
                            int64_t m, int64_t k, int64_t n) {
    #pragma omp parallel for
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            float acc = b[j];
            for (int64_t p = 0; p < k; ++p) acc += x[i * k + p] * w[j * k + p];
            y[i * n + j] = acc > 0.f ? acc : 0.f;
        }
    }
}
""")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # holds W and b; not called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w, b = self.linear.weight.contiguous(), self.linear.bias.contiguous()
        m, k = x.shape
        y = torch.empty(m, w.shape[0], dtype=x.dtype)
        lib.linear_relu(x, w, b, y, m, k, w.shape[0])
        return y
