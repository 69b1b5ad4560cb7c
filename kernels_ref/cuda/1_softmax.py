"""Reference CUDA kernel for 1_softmax: one 256-thread block per row; block reductions for the row
max and the sum of exponentials (max subtracted first, so exp never overflows)."""

import torch
import torch.nn as nn

from kforge.kernels import load_cuda

lib = load_cuda(r"""
#include <cstdint>
#define THREADS 256

// Reduces one value per thread with `op`; every thread gets the result.
template <typename Op>
__device__ float block_reduce(float value, float* scratch, Op op) {
    scratch[threadIdx.x] = value;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) scratch[threadIdx.x] = op(scratch[threadIdx.x], scratch[threadIdx.x + stride]);
        __syncthreads();
    }
    const float result = scratch[0];
    __syncthreads();  // scratch is reused by the next reduction
    return result;
}

struct Max { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct Add { __device__ float operator()(float a, float b) const { return a + b; } };

__global__ void softmax_kernel(const float* x, float* y, int64_t cols) {
    __shared__ float scratch[THREADS];
    const float* row_in = x + (int64_t)blockIdx.x * cols;
    float* row_out = y + (int64_t)blockIdx.x * cols;
    float row_max = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) row_max = fmaxf(row_max, row_in[c]);
    row_max = block_reduce(row_max, scratch, Max());
    float total = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) total += expf(row_in[c] - row_max);
    const float inv_total = 1.f / block_reduce(total, scratch, Add());
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) row_out[c] = expf(row_in[c] - row_max) * inv_total;
}

extern "C" void softmax(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
    softmax_kernel<<<(unsigned)rows, THREADS, 0, stream>>>(x, y, cols);
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
