"""Reference Triton kernel for 1_layernorm: one program per row, the whole row in one block;
y = (x - mean) / sqrt(biased var + eps)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / cols
    centered = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centered * centered, axis=0) / cols
    tl.store(y_ptr + row * cols + offsets, centered / tl.sqrt(var + eps), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.features = features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        block = triton.next_power_of_2(self.features)
        layernorm_kernel[(x.numel() // self.features,)](
            x, y, self.features, float(self.eps), BLOCK=block, num_warps=8 if block >= 2048 else 4
        )
        return y
