"""KernelBench's compatibility path: candidates that build C++/CUDA with torch.utils.cpp_extension.

`load_inline(name=...)` and `load(name=...)` build into TORCH_EXTENSIONS_DIR/<name> by default, one
directory for every candidate that picks the same name (LLMs reuse `elementwise_add`, `fast_op` all
the time): two candidates judged at once could load each other's build. Inside the worker both
functions are wrapped so each build gets a directory keyed by what decides its binary (name, sources,
flags, toolchain, GPU architectures). A candidate's compile, verify and time stages find the same
directory and build once; a candidate with other code finds another one.

A candidate that bypasses the wrappers only loses the speed-up: the wrapper is a convenience, not a
defence (verdicts and times are decided by the orchestrator).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Arguments that do not change the binary.
_NOT_IN_KEY = frozenset({"verbose", "build_directory", "keep_intermediates"})


def _toolchain() -> dict[str, Any]:
    from torch.utils import cpp_extension

    capabilities = []
    if torch.cuda.is_available():
        capabilities = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_home": cpp_extension.CUDA_HOME,
        "python": sys.version,
        "cxx": os.environ.get("CXX"),
        "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"),
        "capabilities": capabilities,
    }


def _file_contents(sources: Any) -> list[str]:
    """What `load`'s source files hold (a missing file is left to torch to report)."""
    paths = [sources] if isinstance(sources, str) else list(sources or [])
    contents = []
    for path in paths:
        try:
            contents.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
        except OSError:
            contents.append(f"unreadable:{path}")
    return contents


def build_key(function_name: str, arguments: dict[str, Any]) -> str:
    """A digest of everything that decides the built binary of one load_inline/load call."""
    keyed = {k: v for k, v in arguments.items() if k not in _NOT_IN_KEY}
    if function_name == "load":
        keyed["source_contents"] = _file_contents(arguments.get("sources"))
    text = json.dumps([function_name, keyed, _toolchain()], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _wrapped(function_name: str, original: Callable[..., Any], root: Path) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def build(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # torch reports the bad call itself
        if bound.arguments.get("build_directory") is None:
            name = str(bound.arguments.get("name", "extension"))
            directory = root / f"{name}-{build_key(function_name, dict(bound.arguments))}"
            directory.mkdir(parents=True, exist_ok=True)
            bound.arguments["build_directory"] = str(directory)
        return original(*bound.args, **bound.kwargs)

    return build


def install() -> Path | None:
    """Wrap torch.utils.cpp_extension.load_inline and load (before the candidate imports them).
    The directory builds go under, or None where the worker has no TORCH_EXTENSIONS_DIR."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        return None
    from torch.utils import cpp_extension

    for function_name in ("load_inline", "load"):
        original = getattr(cpp_extension, function_name)
        setattr(cpp_extension, function_name, _wrapped(function_name, original, Path(root)))
    return Path(root)
