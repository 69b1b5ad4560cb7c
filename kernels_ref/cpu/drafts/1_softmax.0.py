# Deliberately flawed draft: no max subtraction, and each row is divided by the sum of the raw inputs instead of the sum of the exponentials.
import torch
import torch.nn as nn

from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cmath>
#include <cstdint>
extern "C" void softmax(const float* x, float* y, int64_t rows, int64_t cols) {
    #pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float total = 0.f;
        for (int64_t c = 0; c < cols; ++c) {
            yr[c] = std::exp(xr[c]);
            total += xr[c];
        }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= total;
    }
}
""")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        lib.softmax(x, y, x.numel() // cols, cols)
        return y
