"""Device memory shared between a GPU worker and the orchestrator through CUDA IPC handles.

A session worker allocates its input and output buffers with cuMemAlloc (so a handle names exactly
that allocation) and exports their handles; the orchestrator opens them once per session, writes
each call's inputs straight into the worker's input buffers and copies outputs out of its output
buffers, all on the device. Nothing crosses to the host. The orchestrator checks each allocation is
at least as large as the layout says before it touches it: reading past it would fault the context
that judges every candidate. (Measured on an H100 for 64 MB, 2026-11-24: open 0.1-0.3 ms, a copy
and compare about 1 ms, against about 85 ms to write the same bytes to a file on /dev/shm.)
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from tasks.harness.nvrtc import _check_cuda, _current_device, driver

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


def exportable(nbytes: int, device: torch.device) -> tuple[torch.Tensor, str | None]:
    """`nbytes` of device memory in an allocation of its own (alive until this process ends), as a
    byte tensor, and the IPC handle that names exactly that allocation (None for zero bytes)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=device), None
    libcuda = _signatures()
    _current_device()
    pointer = ctypes.c_uint64()
    _check_cuda(libcuda.cuMemAlloc_v2(ctypes.byref(pointer), nbytes), "allocating a shared buffer")
    _exported.append(pointer.value)
    handle = _Handle()
    _check_cuda(libcuda.cuIpcGetMemHandle(ctypes.byref(handle), pointer.value), "exporting a shared buffer")
    return _byte_view(pointer.value, nbytes, device), bytes(handle).hex()


def open_mapping(handle_hex: Any, nbytes: int, device: torch.device) -> tuple[torch.Tensor, Any]:
    """Another process's allocation named by `handle_hex`, mapped here as a byte tensor of `nbytes`,
    and the function that unmaps it; ValueError if the handle does not open or the allocation is
    smaller than `nbytes` (reading past it would fault this process's context, which judges others)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=device), lambda: None
    if not isinstance(handle_hex, str) or len(handle_hex) != 2 * HANDLE_BYTES:
        raise ValueError("a buffer without a handle")
    libcuda = _signatures()
    _current_device()
    handle = _Handle.from_buffer_copy(bytes.fromhex(handle_hex))
    pointer = ctypes.c_uint64()
    status = libcuda.cuIpcOpenMemHandle_v2(ctypes.byref(pointer), handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    if status != 0:
        raise ValueError(f"the worker's buffer handle does not open (CUDA error {status})")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = libcuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer.value)
    if status != 0 or base.value != pointer.value or size.value < nbytes:
        libcuda.cuIpcCloseMemHandle(pointer.value)
        raise ValueError(f"the worker's buffer holds {size.value} bytes, the layout needs {nbytes}")
    return _byte_view(pointer.value, nbytes, device), lambda: libcuda.cuIpcCloseMemHandle(pointer.value)
