"""Reference Triton kernel for 1_softmax: one program per row, the whole row in one block
(max subtracted first, so exp never overflows)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=-float("inf"))
    numerator = tl.exp(x - tl.max(x, axis=0))  # masked lanes: exp(-inf) = 0
    tl.store(y_ptr + row * cols + offsets, numerator / tl.sum(numerator, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        block = triton.next_power_of_2(cols)
        softmax_kernel[(x.numel() // cols,)](x, y, cols, BLOCK=block, num_warps=8 if block >= 2048 else 4)
        return y
