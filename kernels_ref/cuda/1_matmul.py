"""Reference CUDA kernel for 1_matmul: C = A @ B with 16x16 shared-memory tiles, one output per thread;
float accumulation over k in order, as a plain FMA loop."""

import torch
import torch.nn as nn

from kforge.kernels import load_cuda

lib = load_cuda(r"""
#include <cstdint>
#define TILE 16

__global__ void matmul_kernel(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n) {
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE];
    const int64_t row = (int64_t)blockIdx.y * TILE + threadIdx.y;
    const int64_t col = (int64_t)blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int64_t k0 = 0; k0 < k; k0 += TILE) {
        // out-of-range elements load as 0, which adds nothing to the sum
        const int64_t a_col = k0 + threadIdx.x, b_row = k0 + threadIdx.y;
        a_tile[threadIdx.y][threadIdx.x] = (row < m && a_col < k) ? a[row * k + a_col] : 0.f;
        b_tile[threadIdx.y][threadIdx.x] = (b_row < k && col < n) ? b[b_row * n + col] : 0.f;
        __syncthreads();
        for (int p = 0; p < TILE; ++p) acc += a_tile[threadIdx.y][p] * b_tile[p][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[row * n + col] = acc;
}

extern "C" void matmul(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n,
                       cudaStream_t stream) {
    const dim3 grid((unsigned)((n + TILE - 1) / TILE), (unsigned)((m + TILE - 1) / TILE));
    matmul_kernel<<<grid, dim3(TILE, TILE), 0, stream>>>(a, b, c, m, k, n);
}
""")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        A, B = A.contiguous(), B.contiguous()
        m, k = A.shape
        n = B.shape[1]
        C = torch.empty(m, n, dtype=A.dtype, device=A.device)
        lib.matmul(A, B, C, m, k, n)
        return C
