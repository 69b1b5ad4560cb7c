"""Reference Triton kernel for 3_mlp: one linear (+ optional ReLU) kernel launched per layer, 64x64 tiles,
float32 accumulation with input_precision="ieee" (no TF32)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    RELU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
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
    if RELU:
        z = tl.maximum(z, 0.0)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], z, mask=(rows[:, None] < M) & (cols[None, :] < N))


def _linear(x: torch.Tensor, layer: nn.Linear, relu: bool) -> torch.Tensor:
    w, b = layer.weight.contiguous(), layer.bias.contiguous()
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
    linear_kernel[grid](x, w, b, y, m, n, k, RELU=relu, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    return y


class ModelNew(nn.Module):
    def __init__(self, input_size: int, hidden1: int, hidden2: int, output_size: int):
        super().__init__()
        # same layers in the same order as Model, so a shared seed gives identical weights
        self.fc1 = nn.Linear(input_size, hidden1)
        self.fc2 = nn.Linear(hidden1, hidden2)
        self.fc3 = nn.Linear(hidden2, output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _linear(x.contiguous(), self.fc1, relu=True)
        x = _linear(x, self.fc2, relu=True)
        return _linear(x, self.fc3, relu=False)
