"""CUDA fast path: CUDA C++ source -> nvcc shared object -> ctypes launchers on tensor device pointers.

This is the helper API candidates use (re-exported as ``kforge.kernels``)::

    from kforge.kernels import load_cuda

    lib = load_cuda(r'''
    #include <cstdint>
    __global__ void relu_kernel(const float* x, float* y, int64_t n) {
        int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    extern "C" void relu(const float* x, float* y, int64_t n, cudaStream_t stream) {
        relu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);
    }
    ''')
    # in forward:
    x = x.contiguous()
    y = torch.empty_like(x)
    lib.relu(x, y, x.numel())   # no stream here: it is appended

Calling convention:

- The source holds ``__global__`` kernels and ``extern "C"`` host launchers returning void.
  ``cuda_runtime.h`` is already included; include only the headers you use.
- Every launcher's last parameter is ``cudaStream_t stream``. Python passes the other arguments;
  the helper appends the stream torch is using (``torch.cuda.current_stream()``). Launch every
  kernel on it (``kernel<<<grid, block, shared_bytes, stream>>>``) and do not synchronize.
- Arguments are converted by type: a contiguous CUDA ``torch.Tensor`` becomes its device pointer,
  an ``int`` becomes ``int64_t``, a ``float`` becomes ``double``.
- After each launcher call, a launch error (a bad grid or block size, too much shared memory)
  raises RuntimeError naming the launcher. Errors inside a kernel (an illegal address) surface
  at the next synchronization.
- Call ``load_cuda`` once at module level, not in forward: it compiles (about 1.5 s) and caches.

nvcc builds ``-O3 -shared -Xcompiler -fPIC --cudart static -arch=sm_XY`` for the GPU present
(on a host without one, ``$KFORGE_CUDA_ARCH``, default sm_90), so the shared object needs no
libcudart at run time and loads without a GPU. Artifacts are cached by (source hash, nvcc version,
flags, arch) under ``$KFORGE_KERNEL_CACHE/cuda``. An nvcc failure raises CompileError with its log.
Without a GPU the stream is null, CPU tensors are accepted and launch errors are not checked,
so host-only functions can be tested on a CPU machine.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from pathlib import Path

from tasks.harness.cpu import build_cached, kernel_cache_dir, to_c_argument, tool_version

NVCC_FLAGS = ["-O3", "-shared", "-Xcompiler", "-fPIC", "--cudart", "static"]
DEFAULT_ARCH = "sm_90"
# Appended to every source (after the candidate's lines, so nvcc's line numbers stay theirs).
LAUNCH_ERROR_CHECK = r"""
extern "C" const char* kforge_launch_error() {
    cudaError_t error = cudaGetLastError();
    return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}
"""


def nvcc_version() -> str:
    """Last line of `nvcc --version` (names the exact build), or 'nvcc missing'."""
    return tool_version("nvcc", last_line=True)


@functools.lru_cache(maxsize=1)
def gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


def cuda_arch() -> str:
    """sm_XY of the current GPU; without one, $KFORGE_CUDA_ARCH or sm_90 (H100/H200)."""
    if gpu_present():
        import torch

        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return os.environ.get("KFORGE_CUDA_ARCH", DEFAULT_ARCH)


def compile_cuda(source: str) -> Path:
    """Compile CUDA `source` with nvcc to a shared object (or find it in the cache); return its path."""
    full_source = source + LAUNCH_ERROR_CHECK
    flags = [*NVCC_FLAGS, f"-arch={cuda_arch()}"]
    parts = [full_source, nvcc_version(), " ".join(flags)]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return build_cached(full_source, kernel_cache_dir() / "cuda" / f"{key}.so", "kernel.cu", ["nvcc", *flags])


class CudaLibrary:
    """Launchers of a compiled shared object, callable with tensors, ints and floats (stream appended)."""

    def __init__(self, path: Path):
        self._lib = ctypes.CDLL(str(path))
        self._launch_error = self._lib.kforge_launch_error
        self._launch_error.restype = ctypes.c_char_p
        self.path = path

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        c_function = getattr(self._lib, name)
        c_function.restype = None
        if gpu_present():
            import torch

            def call(*args: object) -> None:
                stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
                c_function(*[to_c_argument(a, "cuda", ("cuda",)) for a in args], stream)
                error = self._launch_error()
                if error:
                    raise RuntimeError(f"CUDA error after launcher {name}: {error.decode()}")

        else:

            def call(*args: object) -> None:
                c_function(*[to_c_argument(a, "cuda", ("cuda", "cpu")) for a in args], ctypes.c_void_p(None))

        call.__name__ = name
        setattr(self, name, call)  # later lookups find the attribute and skip __getattr__
        return call


def load_cuda(source: str) -> CudaLibrary:
    """Compile CUDA C++ `source` (cached) and return its `extern "C"` launchers as Python callables."""
    return CudaLibrary(compile_cuda(source))
