"""Reference CUDA kernel for 1_sum_dim: x viewed as (outer, reduced, inner); one thread per output
element walks the reduced dimension, accumulating in double so long sums stay within tolerance."""

import math

import torch
import torch.nn as nn

from kforge.kernels import load_cuda

lib = load_cuda(r"""
#include <cstdint>
__global__ void sum_dim_kernel(const float* x, float* y, int64_t outer, int64_t r, int64_t inner) {
    const int64_t index = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (index >= outer * inner) return;
    const int64_t o = index / inner, i = index % inner;
    const float* column = x + o * r * inner + i;
    double total = 0.0;
    for (int64_t k = 0; k < r; ++k) total += column[k * inner];
    y[index] = (float)total;
}
extern "C" void sum_dim(const float* x, float* y, int64_t outer, int64_t r, int64_t inner, cudaStream_t stream) {
    const int64_t outputs = outer * inner;
    sum_dim_kernel<<<(unsigned)((outputs + 255) / 256), 256, 0, stream>>>(x, y, outer, r, inner);
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
        y = torch.empty(x.shape[:d] + x.shape[d + 1 :], dtype=x.dtype, device=x.device)
        lib.sum_dim(x, y, outer, x.shape[d], inner)
        return y
