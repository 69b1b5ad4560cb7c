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


@functools.lru_cache(maxsize=4)
def tool_version(tool: str, last_line: bool = False) -> str:
    """The first (or last) line of `TOOL --version`, or 'TOOL missing'."""
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"{tool} missing"
    lines = out.strip().splitlines() or [""]
    return (lines[-1] if last_line else lines[0]).strip()


def toolchain_version() -> str:
    """First line of `g++ --version`, or 'g++ missing'."""
    return tool_version("g++")


def kernel_cache_dir() -> Path:
    return Path(os.environ.get("KFORGE_KERNEL_CACHE", Path.home() / ".cache" / "kforge" / "kernels"))


def artifact_key(source: str) -> str:
    """Content hash of everything that decides the compiled bytes."""
    parts = [source, toolchain_version(), " ".join(CXX_FLAGS), platform.machine()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def compile_cpp(source: str) -> Path:
    """Compile `source` to a shared object (or find it in the cache) and return its path."""
    target = kernel_cache_dir() / "cpu" / f"{artifact_key(source)}.so"
    return build_cached(source, target, "kernel.cpp", ["g++", *CXX_FLAGS])


def build_cached(source: str, target: Path, file_name: str, command: list[str]) -> Path:
    """Run `command SRC -o OUT` on `source` saved as `file_name`, then move OUT to `target`;
    an existing `target` is returned as is. Compiler failures raise CompileError with the log."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as build_dir:
        src = Path(build_dir) / file_name
        src.write_text(source)
        partial = Path(build_dir) / "kernel.so"
        try:
            proc = subprocess.run(
                [*command, str(src), "-o", str(partial)],
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise CompileError(f"{command[0]} took longer than {COMPILE_TIMEOUT_S} s") from exc
        if proc.returncode != 0:
            raise CompileError((proc.stderr + proc.stdout).replace(str(src), file_name))
        # rename is atomic: a concurrent worker sees either no file or the whole file
        os.replace(partial, target)
    return target


def to_c_argument(value: object, backend: str = "cpu", tensor_devices: tuple[str, ...] = ("cpu",)) -> object:
    """ctypes value of one kernel argument: a contiguous tensor on one of `tensor_devices` -> its data
    pointer, int (or bool) -> int64_t, float -> double; anything else raises TypeError."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.device.type not in tensor_devices:
            raise TypeError(f"{backend} kernel given a tensor on {value.device}")
        if not value.is_contiguous():
            raise TypeError(f"{backend} kernel given a non-contiguous tensor; call .contiguous() first")
        return ctypes.c_void_p(value.data_ptr())
    if isinstance(value, bool):
        return ctypes.c_int64(int(value))
    if isinstance(value, int):
        return ctypes.c_int64(value)
    if isinstance(value, float):
        return ctypes.c_double(value)
    raise TypeError(f"{backend} kernel argument of type {type(value).__name__}; pass tensors, ints or floats")


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
            c_function(*[to_c_argument(a) for a in args])

        call.__name__ = name
        return call


def load_cpp(source: str) -> CppLibrary:
    """Compile C++ `source` (cached) and return its `extern "C"` functions."""
    return CppLibrary(compile_cpp(source))
