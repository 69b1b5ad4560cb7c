"""CPU fast path: C++ source -> g++ shared object -> ctypes functions on tensor data pointers.

This is the helper API candidates use (re-exported as ``kforge.kernels``)::

    from kforge.kernels import load_cpp

    lib = load_cpp(r'''
    #include <cstdint>
    extern "C" void relu(const float* x, float* y, int64_t n) {
        #pragma omp parallel for
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    ''')
    lib.relu(x, y, x.numel())

Arguments are converted by type: a contiguous CPU ``torch.Tensor`` becomes its data pointer,
an ``int`` becomes ``int64_t``, a ``float`` becomes ``double``. Functions return nothing.
Shared objects are cached by (source hash, compiler version, flags, machine) under
``$KFORGE_KERNEL_CACHE`` (default ``~/.cache/kforge/kernels``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
COMPILE_TIMEOUT_S = 120


class CompileError(Exception):
    """The compiler rejected the candidate's source; the message holds the compiler log."""


@functools.lru_cache(maxsize=1)
def toolchain_version() -> str:
    """First line of `g++ --version`, or 'g++ missing'."""
    try:
        out = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "g++ missing"
    return out.splitlines()[0].strip()


def kernel_cache_dir() -> Path:
    return Path(os.environ.get("KFORGE_KERNEL_CACHE", Path.home() / ".cache" / "kforge" / "kernels"))


def artifact_key(source: str) -> str:
    """Content hash of everything that decides the compiled bytes."""
    parts = [source, toolchain_version(), " ".join(CXX_FLAGS), platform.machine()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def compile_cpp(source: str) -> Path:
    """Compile `source` to a shared object (or find it in the cache) and return its path."""
    cache = kernel_cache_dir() / "cpu"
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{artifact_key(source)}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=cache) as build_dir:
        src = Path(build_dir) / "kernel.cpp"
        src.write_text(source)
        partial = Path(build_dir) / "kernel.so"
        try:
            proc = subprocess.run(
                ["g++", *CXX_FLAGS, str(src), "-o", str(partial)],
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise CompileError(f"g++ took longer than {COMPILE_TIMEOUT_S} s") from exc
        if proc.returncode != 0:
            raise CompileError(proc.stderr.replace(str(src), "kernel.cpp"))
        # rename is atomic: a concurrent worker sees either no file or the whole file
        os.replace(partial, target)
    return target


def _to_c(value: object) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise TypeError(f"cpu kernel given a tensor on {value.device}")
        if not value.is_contiguous():
            raise TypeError("cpu kernel given a non-contiguous tensor; call .contiguous() first")
        return ctypes.c_void_p(value.data_ptr())
    if isinstance(value, bool):
        return ctypes.c_int64(int(value))
    if isinstance(value, int):
        return ctypes.c_int64(value)
    if isinstance(value, float):
        return ctypes.c_double(value)
    raise TypeError(f"cpu kernel argument of type {type(value).__name__}; pass tensors, ints or floats")


class CppLibrary:
    """Functions of a compiled shared object, callable with tensors, ints and floats."""

    def __init__(self, path: Path):
        self._lib = ctypes.CDLL(str(path))
        self.path = path

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        c_function = getattr(self._lib, name)
        c_function.restype = None

        def call(*args: object) -> None:
            c_function(*[_to_c(a) for a in args])

        call.__name__ = name
        return call


def load_cpp(source: str) -> CppLibrary:
    """Compile C++ `source` (cached) and return its `extern "C"` functions."""
    return CppLibrary(compile_cpp(source))
