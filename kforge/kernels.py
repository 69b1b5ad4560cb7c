"""The helper API candidate kernels import (``from kforge.kernels import load_cpp, load_cuda, load_cuda_kernels``)."""

from tasks.harness.cpu import CompileError, load_cpp
from tasks.harness.cuda import load_cuda
from tasks.harness.nvrtc import load_cuda_kernels

__all__ = ["CompileError", "load_cpp", "load_cuda", "load_cuda_kernels"]
