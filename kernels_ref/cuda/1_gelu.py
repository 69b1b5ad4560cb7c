"""Reference CUDA kernel for 1_gelu: exact GELU, 0.5 * x * (1 + erf(x / sqrt(2))), one thread per element."""

import torch
import torch.nn as nn

from kforge.kernels import load_cuda

lib = load_cuda(r"""
#include <cstdint>
__global__ void gelu_kernel(const float* x, float* y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.5f * x[i] * (1.f + erff(x[i] * 0.70710678118654752f));
}
extern "C" void gelu(const float* x, float* y, int64_t n, cudaStream_t stream) {
    gelu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);
}
""")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        lib.gelu(x, y, x.numel())
        return y
