"""Typed views of the raw buffers a session shares: a mapped file on the cpu, IPC memory on a GPU."""

from __future__ import annotations

import mmap

import torch

from tasks.harness.protocol import TensorSpec

DTYPES = {
    str(dtype): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    )
}


def typed(raw: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """The first spec.nbytes of the byte tensor `raw` as a tensor of the spec's dtype and shape."""
    if spec.nbytes == 0:
        return torch.empty(spec.shape, dtype=DTYPES[spec.dtype], device=raw.device)
    return raw[: spec.nbytes].view(DTYPES[spec.dtype]).view(spec.shape)


def file_view(shared: mmap.mmap, offset: int, spec: TensorSpec) -> torch.Tensor:
    """The spec's tensor at `offset` of a mapped file (writes go to the file, so both sides see them)."""
    if spec.nbytes == 0:
        return torch.empty(spec.shape, dtype=DTYPES[spec.dtype])
    return typed(torch.frombuffer(shared, dtype=torch.uint8, count=spec.nbytes, offset=offset), spec)
