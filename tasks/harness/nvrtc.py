"""NVRTC fast path: CUDA device code -> NVRTC cubin -> kernels launched through the CUDA driver API.

This is the helper API candidates use (re-exported as ``kforge.kernels``)::

    from kforge.kernels import load_cuda_kernels

    kernels = load_cuda_kernels(r'''
    extern "C" __global__ void relu(const float* x, float* y, int64_t n) {
        int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    ''')
    kernels.relu(grid=(x.numel() + 255) // 256, block=256, args=(x, y, x.numel()))   # in forward

Calling convention:

- Device code only: ``extern "C" __global__`` kernels (the name is the Python attribute) and
  their ``__device__`` helpers; no host code. ``int64_t`` and the other fixed-width integers,
  ``INFINITY`` and ``NAN`` are predefined, ``<cstdint>`` and ``<cmath>`` are accepted, and the
  toolkit's headers (``cuda_fp16.h``, ``cuda_bf16.h``) are found when present.
- ``kernels.NAME(grid, block, args=(...), shared_mem=0)`` launches on torch's current stream and
  does not synchronize. ``grid`` and ``block`` are an int or a tuple of up to three ints;
  ``shared_mem`` is dynamic shared memory in bytes (above 48 KiB the kernel is opted in to it).
- ``args`` are converted by the size of each kernel parameter, as the cubin records it: a
  contiguous CUDA ``torch.Tensor`` becomes its device pointer, an ``int`` an integer of that size
  (``int``, ``int64_t``, unsigned alike), a ``float`` a ``float`` (4 bytes) or ``double`` (8).
  A wrong count or an int that does not fit raises TypeError.
- A launch the driver refuses (a bad grid or block size, too much shared memory) raises
  RuntimeError naming the kernel. Errors inside a kernel surface at the next synchronization.
- Call ``load_cuda_kernels`` once at module level, not in forward: it compiles and caches.

NVRTC compiles for the GPU present (``sm_XY``; without one ``$KFORGE_CUDA_ARCH``, default sm_90) in
the calling process, with no host compiler, and needs no GPU; cubins are cached by (source hash,
NVRTC build, options, arch) under ``$KFORGE_KERNEL_CACHE/nvrtc``. A compile failure raises
CompileError with NVRTC's log. libnvrtc is looked for under $CUDA_HOME, $CUDA_PATH, the
nvidia-cuda-nvrtc wheel and /usr/local/cuda*. Launching needs a driver of CUDA 12.4 or later.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

from tasks.harness.cpu import CompileError, kernel_cache_dir
from tasks.harness.cuda import cuda_arch, gpu_present

# Pre-included into every program: what nvcc's implicit cuda_runtime.h gives kernels and NVRTC lacks
# (the integer types exactly as CCCL declares them under NVRTC, so <cuda/std/cstdint> agrees).
PRELUDE = r"""
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long long uint64_t; typedef int64_t intptr_t; typedef uint64_t uintptr_t;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#endif
"""
# Standard headers whose content the prelude already provides: #include of them is a no-op.
HEADERS = {"kforge_prelude.h": PRELUDE, **dict.fromkeys(["cstdint", "stdint.h", "cmath", "math.h"], "")}
OPTIONS = ["--std=c++17", "--pre-include=kforge_prelude.h"]
LARGE_SHARED_MEM = 48 * 1024  # above this a kernel must opt in (cuFuncSetAttribute)
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def _search_dirs(subdir: str) -> list[Path]:
    """Toolkit folders named `subdir` ("lib" also finds lib64, first): under $CUDA_HOME, $CUDA_PATH, the
    nvidia-* pip wheels (torch's CUDA builds depend on them) and /usr/local/cuda*, in that order."""
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    wheels = importlib.util.find_spec("nvidia")
    for namespace in (wheels.submodule_search_locations or []) if wheels else []:
        roots += sorted(Path(namespace).iterdir())
    roots += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
    names = ["lib64", "lib"] if subdir == "lib" else [subdir]
    return [root / name for root in roots for name in names if (root / name).is_dir()]


@functools.lru_cache(maxsize=1)
def nvrtc_library() -> ctypes.CDLL:
    """The first libnvrtc found, with libnvrtc-builtins from its folder loaded first (NVRTC dlopens it by name)."""
    for folder in _search_dirs("lib"):
        if found := sorted(folder.glob("libnvrtc.so*"), key=lambda p: len(p.name)):
            for builtins in folder.glob("libnvrtc-builtins.so.*"):
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
            nvrtc = ctypes.CDLL(str(found[0]))
            nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
            return nvrtc
    raise OSError("libnvrtc not found: pip install nvidia-cuda-nvrtc, or set CUDA_HOME to a CUDA toolkit")


def nvrtc_version() -> str:
    """'nvrtc 13.0 /path/to/libnvrtc.so.13': the release and the library file, for cache keys."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc_library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"nvrtc {major.value}.{minor.value} {os.path.realpath(nvrtc_library()._name)}"


@functools.lru_cache(maxsize=1)
def include_options() -> tuple[str, ...]:
    """-I for the first toolkit include folder with cuda_fp16.h, and its cccl/ (for <cuda/std/...>)."""
    folder = next((d for d in _search_dirs("include") if (d / "cuda_fp16.h").exists()), None)
    return () if folder is None else tuple(f"-I{d}" for d in (folder, folder / "cccl") if d.is_dir())


def compile_cubin(source: str) -> Path:
    """Compile CUDA device code `source` with NVRTC to a cubin (or find it in the cache); return its path."""
    options = [*OPTIONS, f"--gpu-architecture={cuda_arch()}", *include_options()]
    key = hashlib.sha256("\0".join([source, PRELUDE, nvrtc_version(), *options]).encode()).hexdigest()[:24]
    target = kernel_cache_dir() / "nvrtc" / f"{key}.cubin"
    if target.exists():
        return target
    cubin = _nvrtc_compile(source, options)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".partial", delete=False) as partial:
        partial.write(cubin)
    os.replace(partial.name, target)  # atomic: a concurrent worker sees no file or the whole file
    return target


def _nvrtc_compile(source: str, options: list[str]) -> bytes:
    """The cubin of `source`; CompileError with NVRTC's log when it does not compile."""
    nvrtc, program, size = nvrtc_library(), ctypes.c_void_p(), ctypes.c_size_t()

    def strings(values) -> ctypes.Array:
        return (ctypes.c_char_p * len(values))(*[v.encode() for v in values])

    headers = strings(list(HEADERS.values())), strings(list(HEADERS))
    _check_nvrtc(nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", len(HEADERS), *headers))
    try:
        status = nvrtc.nvrtcCompileProgram(program, len(options), strings(options))
        if status != 0:
            nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(program, log)
            raise CompileError(log.value.decode(errors="replace").strip() or nvrtc.nvrtcGetErrorString(status).decode())
        _check_nvrtc(nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size)))
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(nvrtc.nvrtcGetCUBIN(program, cubin))
        return cubin.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def _check_nvrtc(status: int) -> None:
    if status != 0:
        raise RuntimeError(f"NVRTC error: {nvrtc_library().nvrtcGetErrorString(status).decode()}")


# ---- loading and launching (GPU only) ----------------------------------------------------------


@functools.lru_cache(maxsize=1)
def driver() -> ctypes.CDLL:
    """libcuda (the driver API), initialized, with the signatures that take 64-bit or unsigned values declared."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    libcuda.cuLaunchKernel.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, *[ctypes.c_void_p] * 3]
    libcuda.cuFuncGetParamInfo.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    _check_cuda(libcuda.cuInit(0), "initializing the driver", libcuda)
    return libcuda


def _check_cuda(status: int, doing: str, libcuda: ctypes.CDLL | None = None) -> None:
    if status != 0:
        libcuda, name, text = libcuda or driver(), ctypes.c_char_p(), ctypes.c_char_p()
        libcuda.cuGetErrorName(status, ctypes.byref(name))
        libcuda.cuGetErrorString(status, ctypes.byref(text))
        raise RuntimeError(f"CUDA error {doing}: {(text.value or b'?').decode()} ({(name.value or b'?').decode()})")


@functools.cache
def _primary_context(device: int) -> ctypes.c_void_p:
    handle, context = ctypes.c_int(), ctypes.c_void_p()
    _check_cuda(driver().cuDeviceGet(ctypes.byref(handle), device), f"getting device {device}")
    _check_cuda(driver().cuDevicePrimaryCtxRetain(ctypes.byref(context), handle), f"opening device {device}")
    return context


def _current_device() -> int:
    """torch's current device, its primary context (the one torch's runtime uses) made current on this thread."""
    import torch

    device, current = torch.cuda.current_device(), ctypes.c_void_p()
    _check_cuda(driver().cuCtxGetCurrent(ctypes.byref(current)), "reading the current context")
    if current.value != _primary_context(device).value:
        _check_cuda(driver().cuCtxSetCurrent(_primary_context(device)), f"making device {device} current")
    return device


def _dim3(value: int | tuple[int, ...]) -> tuple[int, ...]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3:
        raise TypeError(f"grid and block are an int or 1 to 3 ints, got {value!r}")
    return (*dims, 1, 1, 1)[:3]


def _to_parameter(where: str, value: object, size: int) -> ctypes._SimpleCData:
    """The ctypes value of one argument for a kernel parameter of `size` bytes."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.device.type != "cuda" or not value.is_contiguous():
            raise TypeError(f"{where}: a tensor must be contiguous and on the GPU, got one on {value.device}")
        return ctypes.c_void_p(value.data_ptr())
    if isinstance(value, int) and size in (1, 2, 4, 8):
        if not -(2 ** (8 * size - 1)) <= value < 2 ** (8 * size):
            raise TypeError(f"{where}: {value} does not fit its {size}-byte parameter")
        return {1: ctypes.c_int8, 2: ctypes.c_int16, 4: ctypes.c_int32, 8: ctypes.c_int64}[size](value)
    if isinstance(value, float) and size in (4, 8):
        return ctypes.c_float(value) if size == 4 else ctypes.c_double(value)
    raise TypeError(f"{where}: cannot pass {type(value).__name__} as a {size}-byte parameter")


class CudaKernel:
    """One `extern "C" __global__` function of a cubin; calling it launches it on torch's current stream."""

    def __init__(self, kernels: CudaKernels, name: str):
        self.name, self._kernels, self._shared_mem_limit = name, kernels, LARGE_SHARED_MEM
        self._functions: dict[int, tuple[ctypes.c_void_p, list[int]]] = {}  # device -> (CUfunction, param sizes)

    def _function(self, device: int) -> tuple[ctypes.c_void_p, list[int]]:
        if device not in self._functions:
            function, offset, size, sizes = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t(), []
            if driver().cuModuleGetFunction(ctypes.byref(function), self._kernels._module(device), self.name.encode()):
                raise AttributeError(f'no kernel {self.name} in the cubin: declare it extern "C" __global__')
            while driver().cuFuncGetParamInfo(function, len(sizes), ctypes.byref(offset), ctypes.byref(size)) == 0:
                sizes.append(size.value)
            self._functions[device] = (function, sizes)
        return self._functions[device]

    def __call__(self, grid, block, args=(), shared_mem: int = 0) -> None:
        import torch

        if not gpu_present():
            raise RuntimeError(f"kernel {self.name} cannot launch: no CUDA GPU")
        function, sizes = self._function(_current_device())
        if len(args) != len(sizes):
            raise TypeError(f"kernel {self.name} takes {len(sizes)} arguments, got {len(args)}")
        values = [_to_parameter(f"kernel {self.name} argument {i}", a, n) for i, (a, n) in enumerate(zip(args, sizes))]
        pointers = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        if shared_mem > self._shared_mem_limit:
            status = driver().cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem)
            _check_cuda(status, f"giving kernel {self.name} {shared_mem} bytes of shared memory")
            self._shared_mem_limit = shared_mem
        stream = torch.cuda.current_stream().cuda_stream
        launch = (*_dim3(grid), *_dim3(block), shared_mem, stream, pointers, None)
        _check_cuda(driver().cuLaunchKernel(function, *launch), f"launching kernel {self.name}")


class CudaKernels:
    """The kernels of a cubin as attributes (``kernels.relu``); with a GPU, the cubin is loaded at once."""

    def __init__(self, path: Path):
        self.path, self._cubin = path, path.read_bytes()
        self._modules: dict[int, ctypes.c_void_p] = {}  # device -> CUmodule
        if gpu_present():  # so a cubin this GPU cannot run fails where it is loaded, not in forward
            self._module(_current_device())

    def _module(self, device: int) -> ctypes.c_void_p:
        if device not in self._modules:
            module = ctypes.c_void_p()
            _check_cuda(driver().cuModuleLoadData(ctypes.byref(module), self._cubin), f"loading {self.path.name}")
            self._modules[device] = module
        return self._modules[device]

    def __getattr__(self, name: str) -> CudaKernel:
        if name.startswith("_"):
            raise AttributeError(name)
        kernel = CudaKernel(self, name)
        if gpu_present():  # a missing kernel fails at the lookup, not at the first launch
            kernel._function(_current_device())
        setattr(self, name, kernel)  # later lookups find the attribute and skip __getattr__
        return kernel


def load_cuda_kernels(source: str) -> CudaKernels:
    """Compile CUDA device code `source` with NVRTC (cached) and return its `extern "C" __global__` kernels."""
    return CudaKernels(compile_cubin(source))
