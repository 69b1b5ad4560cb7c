"""Outputs handed from a GPU worker to the parent as CUDA IPC memory handles: nothing crosses to the host.

The worker copies each output tensor into a device allocation of its own (cuMemAlloc, so the handle
names exactly that memory), exports the allocation's handle into its result and waits to be killed.
The parent opens each handle, checks the allocation is as large as the header says, copies the bytes
into its own device memory, closes the handle and only then lets the worker go; the comparison runs on
the GPU in the parent, which never runs candidate code. Measured on an H100 for a 64 MB output with a
two-process probe (2026-11-24): export 0.5 ms, open 0.1-0.3 ms, copy and compare about 1 ms, against
about 85 ms to write it to a file on /dev/shm and 70-90 ms to read and compare it on the host. In the
pipeline, benchmarks/integrity_overhead.py reports them as `save` and `judge`.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from tasks.harness.checks import as_tensor_list
from tasks.harness.nvrtc import _check_cuda, _current_device, driver
from tasks.harness.tensorfile import DTYPES

HANDLE_BYTES = 64
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
_exported: list[int] = []  # this worker's exported allocations: alive until the process ends


class _Handle(ctypes.Structure):  # CUipcMemHandle, passed by value
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


class _DeviceBytes:
    """`nbytes` bytes of device memory at `pointer`, as torch.as_tensor reads them."""

    def __init__(self, pointer: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (pointer, False),
            "version": 3,
        }


@functools.cache
def _signatures() -> ctypes.CDLL:
    """libcuda with the IPC calls' argument types declared (once per process)."""
    libcuda = driver()
    libcuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    libcuda.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
    libcuda.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]
    libcuda.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    libcuda.cuMemGetAddressRange_v2.argtypes = [
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_uint64,
    ]
    return libcuda


def _byte_view(pointer: int, nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(_DeviceBytes(pointer, nbytes), device=device)


def export(output: Any) -> dict[str, Any]:
    """A header naming `output` (a CUDA tensor, or a tuple/list of them) by IPC handles of copies
    in allocations this process keeps until it exits."""
    tensors = as_tensor_list(output)
    header: dict[str, Any] = {
        "container": type(output).__name__ if isinstance(output, (tuple, list)) else None,
        "tensors": [],
    }
    libcuda = _signatures()
    _current_device()
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        meta = {"dtype": str(tensor.dtype), "shape": list(tensor.shape), "handle": None}
        if nbytes:
            pointer = ctypes.c_uint64()
            _check_cuda(libcuda.cuMemAlloc_v2(ctypes.byref(pointer), nbytes), "allocating an output copy")
            _exported.append(pointer.value)
            copy = _byte_view(pointer.value, nbytes, tensor.device).view(tensor.dtype).view(tensor.shape)
            copy.copy_(tensor.detach())
            torch.cuda.synchronize(tensor.device)
            handle = _Handle()
            _check_cuda(libcuda.cuIpcGetMemHandle(ctypes.byref(handle), pointer.value), "exporting an output")
            meta["handle"] = bytes(handle).hex()
        header["tensors"].append(meta)
    return header


def take(header: Any, device: torch.device) -> Any:
    """What `export` named, copied into this process's memory on `device`; ValueError if the header
    does not add up or a handle cannot be opened (the worker is gone, or wrote something else)."""
    if not isinstance(header, dict) or not isinstance(header.get("tensors"), list):
        raise ValueError("not an output header")
    libcuda = _signatures()
    _current_device()
    tensors = []
    for meta in header["tensors"]:
        dtype = DTYPES.get(meta.get("dtype")) if isinstance(meta, dict) else None
        shape = meta.get("shape") if dtype is not None else None
        sizes_ok = isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
        if not sizes_ok:
            raise ValueError(f"a malformed tensor entry: {str(meta)[:200]}")
        nbytes = torch.empty(0, dtype=dtype).element_size()
        for n in shape:
            nbytes *= n
        tensors.append(_open_copy(libcuda, meta.get("handle"), nbytes, device).view(dtype).view(shape))
    container = header.get("container")
    if container is None:
        if len(tensors) != 1:
            raise ValueError(f"a single output with {len(tensors)} tensors")
        return tensors[0]
    return tuple(tensors) if container == "tuple" else tensors


def _open_copy(libcuda: ctypes.CDLL, handle_hex: Any, nbytes: int, device: torch.device) -> torch.Tensor:
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    if not isinstance(handle_hex, str) or len(handle_hex) != 2 * HANDLE_BYTES:
        raise ValueError("a tensor entry without a handle")
    handle = _Handle.from_buffer_copy(bytes.fromhex(handle_hex))
    pointer = ctypes.c_uint64()
    status = libcuda.cuIpcOpenMemHandle_v2(ctypes.byref(pointer), handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    if status != 0:
        raise ValueError(f"the output's memory handle does not open (CUDA error {status})")
    try:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        status = libcuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer.value)
        # reading past the allocation would fault this process's CUDA context, which judges every candidate
        if status != 0 or base.value != pointer.value or size.value < nbytes:
            raise ValueError(f"the output's allocation holds {size.value} bytes, the header says {nbytes}")
        owned = torch.empty(nbytes, dtype=torch.uint8, device=device)
        owned.copy_(_byte_view(pointer.value, nbytes, device))
        torch.cuda.synchronize(device)
    finally:
        libcuda.cuIpcCloseMemHandle(pointer.value)
    return owned
