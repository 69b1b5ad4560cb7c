"""Reference CUDA kernel for 1_layernorm: one 256-thread block per row; block reductions for the mean,
then for the biased variance around it; y = (x - mean) / sqrt(var + eps)."""

import torch
import torch.nn as nn

from kforge.kernels import load_cuda

lib = load_cuda(r"""
#include <cstdint>
#define THREADS 256

// Sum of one value per thread; every thread gets the result.
__device__ float block_sum(float value, float* scratch) {
    scratch[threadIdx.x] = value;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];
        __syncthreads();
    }
    const float result = scratch[0];
    __syncthreads();  // scratch is reused by the next reduction
    return result;
}

__global__ void layernorm_kernel(const float* x, float* y, int64_t cols, float eps) {
    __shared__ float scratch[THREADS];
    const float* row_in = x + (int64_t)blockIdx.x * cols;
    float* row_out = y + (int64_t)blockIdx.x * cols;
    float partial = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) partial += row_in[c];
    const float mean = block_sum(partial, scratch) / cols;
    partial = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
        const float centered = row_in[c] - mean;
        partial += centered * centered;
    }
    const float inv_std = 1.f / sqrtf(block_sum(partial, scratch) / cols + eps);
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) row_out[c] = (row_in[c] - mean) * inv_std;
}

extern "C" void layernorm(const float* x, float* y, int64_t rows, int64_t cols, double eps, cudaStream_t stream) {
    layernorm_kernel<<<(unsigned)rows, THREADS, 0, stream>>>(x, y, cols, (float)eps);
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
