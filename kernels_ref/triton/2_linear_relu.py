"""Reference Triton kernel for 2_linear_relu: y = max(x @ W^T + b, 0) in one kernel, 64x64 tiles,
float32 accumulation with input_precision="ieee" (no TF32)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_relu_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    """y = epilogue(x @ w^T + b) for x (M, K), w (N, K): one (BLOCK_M, BLOCK_N) tile of y per program."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        # w^T tile (BLOCK_K, BLOCK_N) read straight from row-major w
        w_t = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(x, w_t, acc, input_precision="ieee")
    z = acc + tl.load(b_ptr + cols, mask=cols < N, other=0.0)[None, :]
    z = tl.maximum(z, 0.0)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], z, mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # holds W and b; not called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w, b = self.linear.weight.contiguous(), self.linear.bias.contiguous()
        m, k = x.shape
        n = w.shape[0]
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
        linear_relu_kernel[grid](x, w, b, y, m, n, k, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
        return y
