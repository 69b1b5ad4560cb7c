"""The helper API candidate kernels import (``from kforge.kernels import load_cpp``)."""

from tasks.harness.cpu import CompileError, load_cpp

__all__ = ["CompileError", "load_cpp"]
