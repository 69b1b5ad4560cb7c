# Deliberately flawed draft: the sums are right but the output keeps the reduced dim as size 1 (keepdim=True shape).
import math

import torch
import torch.nn as nn

from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cstdint>
extern "C" void sum_dim(const float* x, float* y, int64_t outer, int64_t r, int64_t inner) {
    #pragma omp parallel for
    for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) y[o * inner + i] = 0.f;
        for (int64_t k = 0; k < r; ++k) {
            const float* row = x + (o * r + k) * inner;
            for (int64_t i = 0; i < inner; ++i) y[o * inner + i] += row[i];
        }
    }
}
""")


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        d = self.dim % x.dim()
        outer = math.prod(x.shape[:d])
        inner = math.prod(x.shape[d + 1 :])
        y = torch.empty(x.shape[:d] + (1,) + x.shape[d + 1 :], dtype=x.dtype)
        lib.sum_dim(x, y, outer, x.shape[d], inner)
        return y
