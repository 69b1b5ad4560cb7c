"""Reference CUDA kernel for 2_linear_relu: y = max(x @ W^T + b, 0) in one kernel, 16x16 shared-memory tiles."""

import torch
import torch.nn as nn

from kforge.kernels import load_cuda

lib = load_cuda(r"""
#include <cstdint>
#define TILE 16

// y[i][j] = epilogue(sum_p x[i][p] * w[j][p] + b[j]) for x (m, k), w (n, k): 16x16 output tiles,
// both operands staged through shared memory along k.
__global__ void linear_relu_kernel(const float* x, const float* w, const float* b, float* y,
                                   int64_t m, int64_t k, int64_t n) {
    __shared__ float x_tile[TILE][TILE];
    __shared__ float w_tile[TILE][TILE + 1];  // +1: threads of a warp read a column without bank conflicts
    const int64_t row = (int64_t)blockIdx.y * TILE + threadIdx.y;
    const int64_t col = (int64_t)blockIdx.x * TILE + threadIdx.x;
    const int64_t w_row = (int64_t)blockIdx.x * TILE + threadIdx.y;
    float acc = 0.f;
    for (int64_t k0 = 0; k0 < k; k0 += TILE) {
        const int64_t p = k0 + threadIdx.x;
        x_tile[threadIdx.y][threadIdx.x] = (row < m && p < k) ? x[row * k + p] : 0.f;
        w_tile[threadIdx.y][threadIdx.x] = (w_row < n && p < k) ? w[w_row * k + p] : 0.f;
        __syncthreads();
        for (int q = 0; q < TILE; ++q) acc += x_tile[threadIdx.y][q] * w_tile[threadIdx.x][q];
        __syncthreads();
    }
    if (row < m && col < n) {
        const float z = acc + b[col];
        y[row * n + col] = z > 0.f ? z : 0.f;
    }
}

extern "C" void linear_relu(const float* x, const float* w, const float* b, float* y,
                            int64_t m, int64_t k, int64_t n, cudaStream_t stream) {
    const dim3 grid((unsigned)((n + TILE - 1) / TILE), (unsigned)((m + TILE - 1) / TILE));
    linear_relu_kernel<<<grid, dim3(TILE, TILE), 0, stream>>>(x, w, b, y, m, k, n);
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
        y = torch.empty(m, w.shape[0], dtype=x.dtype, device=x.device)
        lib.linear_relu(x, w, b, y, m, k, w.shape[0])
        return y
