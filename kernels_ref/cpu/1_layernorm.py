"""Reference CPU kernel for 1_layernorm: per-row (x - mean) / sqrt(var + eps), biased variance."""

import torch
import torch.nn as nn

from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cmath>
#include <cstdint>
extern "C" void layernorm(const float* x, float* y, int64_t rows, int64_t cols, double eps) {
    #pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        double mean = 0.0;
        for (int64_t c = 0; c < cols; ++c) mean += xr[c];
        mean /= cols;
        double var = 0.0;
        for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
        var /= cols;
        const double inv_std = 1.0 / std::sqrt(var + eps);
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (float)((xr[c] - mean) * inv_std);
    }
}
""")


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.features = features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        lib.layernorm(x, y, x.numel() // self.features, self.features, float(self.eps))
        return y
