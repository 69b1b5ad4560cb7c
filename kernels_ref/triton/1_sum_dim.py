"""Reference Triton kernel for 1_sum_dim: x viewed as (outer, reduced, inner); each program sums a
(BLOCK_R, BLOCK_I) tile at a time down the reduced dimension (a tree sum per tile keeps long sums accurate)."""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_dim_kernel(x_ptr, y_ptr, r, inner, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    o = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    acc = tl.zeros([BLOCK_I], dtype=tl.float32)
    for r0 in range(0, r, BLOCK_R):
        rows = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
        mask = (rows[:, None] < r) & (cols[None, :] < inner)
        tile = tl.load(x_ptr + (o * r + rows[:, None]) * inner + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(y_ptr + o * inner + cols, acc, mask=cols < inner)


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
        block_i = min(128, triton.next_power_of_2(inner))
        sum_dim_kernel[(outer, triton.cdiv(inner, block_i))](x, y, x.shape[d], inner, BLOCK_R=32, BLOCK_I=block_i)
        return y
