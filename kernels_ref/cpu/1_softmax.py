"""Reference CPU kernel for 1_softmax: row-wise softmax with max subtraction."""

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
        float mx = xr[0];
        for (int64_t c = 1; c < cols; ++c) mx = xr[c] > mx ? xr[c] : mx;
        double total = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
            yr[c] = std::exp(xr[c] - mx);
            total += yr[c];
        }
        const float inv = (float)(1.0 / total);
        for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
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
