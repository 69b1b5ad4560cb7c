"""KernelBench's compatibility path: candidates that build C++/CUDA with torch.utils.cpp_extension.

`load_inline(name=...)` and `load(name=...)` build into TORCH_EXTENSIONS_DIR/<name> by default, one
directory for every candidate that picks the same name (LLMs reuse `elementwise_add`, `fast_op` all
the time): two candidates judged at once could load each other's build. Inside the worker both
functions are wrapped so each build gets a directory keyed by what decides its binary (name, sources,
flags, toolchain, GPU architectures). A candidate's compile, verify and time stages find the same
directory and build once; a candidate with other code finds another one.

A candidate that bypasses the wrappers only loses the speed-up: the wrapper is a convenience, not a
defence (verdicts and times are decided by the orchestrator).

Two measures make these builds faster (benchmarks/inline_compile.py has the figures):
- the C++ part: load_inline's generated main.cpp starts with `#include <torch/extension.h>`, most of
  its compile time. The orchestrator precompiles that header once per toolchain (`prepare_header`,
  g++ on torch's own headers, no candidate code) into a directory workers can read but not change;
  the wrapper puts it first on the include path. GCC checks a precompiled header against the
  build's options and ignores one that does not fit, so it can only make a build faster.
- the CUDA part: torch already puts `<torch/types.h>` on top of cuda_sources; the candidate's own
  `#include <torch/extension.h>` there (every KernelBench example has it) pulls in the whole C++
  frontend and pybind11 for nvcc to parse. The wrapper drops that line; when the lighter build
  fails, the candidate's sources are built as written, so a compile error is always its own.
- `KFORGE_INLINE_BUILD=split` (not yet the default: measured on the CPU only) first builds the CUDA
  part split in two (tasks/harness/cuda_split.py): the kernels alone for nvcc, behind an empty
  torch/types.h, and the host code in main.cpp with the precompiled header.
KFORGE_INLINE_BUILD=plain turns them off.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Arguments that do not change the binary.
_NOT_IN_KEY = frozenset({"verbose", "build_directory", "keep_intermediates"})
HEAVY_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]torch/extension\.h[>\"][ \t]*$", re.MULTILINE)
HEADER_BUILD_TIMEOUT_S = 600


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


def _header_command(output: Path) -> list[str]:
    """g++ precompiling torch/extension.h with the options torch's own builds (and its use_pch) use."""
    from torch.utils import cpp_extension

    torch_include = Path(cpp_extension.include_paths()[0])
    torch_pch = inspect.getsource(cpp_extension._check_and_build_extension_h_precompiler_headers)
    standard = re.search(r"-std=c\+\+\d+", torch_pch)
    command = [cpp_extension.get_cxx_compiler(), "-x", "c++-header", str(torch_include / "torch" / "extension.h")]
    command += ["-o", str(output), "-DTORCH_API_INCLUDE_EXTENSION_H", "-fPIC"]
    command.append(standard.group(0) if standard else "-std=c++17")
    for flags in ("_get_pybind11_abi_build_flags", "_get_glibcxx_abi_build_flags"):
        if hasattr(cpp_extension, flags):
            command += getattr(cpp_extension, flags)()
    for include in [*cpp_extension.include_paths(), sysconfig.get_path("include")]:
        command += ["-isystem", include]
    return command


def header_directory(root: Path) -> Path:
    """Where the precompiled torch/extension.h for this toolchain lives (or will) under `root`, the
    kernel cache (KFORGE_KERNEL_CACHE), whose sticky bit keeps other users from renaming it."""
    key = hashlib.sha256(json.dumps(_header_command(Path("out")), sort_keys=True).encode()).hexdigest()[:16]
    return root / f"headers-{key}"


def prepare_header(root: Path) -> Path | None:
    """Precompile torch/extension.h under `root` (the kernel cache) once per toolchain. Runs in the
    orchestrator: the directory is its own, which a worker can read but neither change nor rename.
    None when the compiler fails (builds just stay slower)."""
    import fcntl

    directory = header_directory(root)
    done = directory / "torch" / "extension.h.gch"
    forwarder = directory / "torch" / "extension.h"
    if done.exists() and forwarder.exists():
        return directory
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (directory / "torch").mkdir(parents=True, exist_ok=True)
        if not done.exists():
            partial = done.with_name(f"extension.h.gch.{os.getpid()}")
            try:
                subprocess.run(
                    _header_command(partial), check=True, capture_output=True, timeout=HEADER_BUILD_TIMEOUT_S
                )
            except (OSError, subprocess.SubprocessError):
                partial.unlink(missing_ok=True)
                return None
            os.replace(partial, done)
        if not forwarder.exists():
            # GCC takes a .gch only for the first include of a header; a second
            # `#include <torch/extension.h>` (a split build's host half, or a candidate's cpp_sources)
            # then looks for the header itself in this directory and must find the real one.
            partial = forwarder.with_name(f"extension.h.{os.getpid()}")
            partial.write_text("#pragma once\n#include_next <torch/extension.h>\n")
            os.replace(partial, forwarder)
    return directory


def _with_header(arguments: dict[str, Any], kernel_cache: Path | None) -> dict[str, Any]:
    """The precompiled header first on the include path, where the orchestrator made one."""
    headers = header_directory(kernel_cache) if kernel_cache else None
    if not headers or not all((headers / "torch" / name).exists() for name in ("extension.h.gch", "extension.h")):
        return arguments
    return {**arguments, "extra_include_paths": [str(headers), *(arguments.get("extra_include_paths") or [])]}


def _trimmed(arguments: dict[str, Any]) -> dict[str, Any]:
    """load_inline's arguments without torch/extension.h in cuda_sources."""
    cuda_sources = arguments.get("cuda_sources")
    if isinstance(cuda_sources, str):
        return {**arguments, "cuda_sources": HEAVY_INCLUDE.sub("", cuda_sources)}
    if isinstance(cuda_sources, list | tuple):
        lighter = [HEAVY_INCLUDE.sub("", s) if isinstance(s, str) else s for s in cuda_sources]
        return {**arguments, "cuda_sources": lighter}
    return arguments


def _halved(arguments: dict[str, Any]) -> dict[str, Any] | None:
    """load_inline's arguments with cuda_sources split (tasks/harness/cuda_split.py): its kernels
    stay in cuda_sources, its host code follows cpp_sources. None where it does not split."""
    from tasks.harness import cuda_split

    cuda_sources = arguments.get("cuda_sources")
    if isinstance(cuda_sources, list | tuple) and all(isinstance(s, str) for s in cuda_sources):
        cuda_sources = "\n".join(cuda_sources)
    if not isinstance(cuda_sources, str) or not (halves := cuda_split.split(cuda_sources)):
        return None
    kernels, host = halves
    cpp_sources = arguments.get("cpp_sources") or []
    cpp_sources = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources)
    return {**arguments, "cuda_sources": kernels, "cpp_sources": [*cpp_sources, host]}


def _with_shadow(arguments: dict[str, Any]) -> dict[str, Any]:
    """An empty torch/types.h ahead of torch's for nvcc alone (load_inline puts that header on top of
    cuda_sources; a split source's kernels need none of it), in the build's own directory."""
    shadow = Path(arguments["build_directory"]) / "kforge-shadow"
    header = shadow / "torch" / "types.h"
    if not header.exists():  # written once: a newer header would have ninja build the kernels again
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_text("// the kernels of a split source use no torch (kforge)\n")
    return {**arguments, "extra_cuda_cflags": [f"-I{shadow}", *(arguments.get("extra_cuda_cflags") or [])]}


def _wrapped(function_name: str, original: Callable[..., Any], root: Path) -> Callable[..., Any]:
    from torch.utils import cpp_extension

    signature = inspect.signature(original)

    def in_own_directory(arguments: dict[str, Any]) -> dict[str, Any]:
        if arguments.get("build_directory") is None:
            name = str(arguments.get("name", "extension"))
            directory = root / f"{name}-{build_key(function_name, arguments)}"
            arguments = {**arguments, "build_directory": str(directory)}
        return arguments

    def built(arguments: dict[str, Any]) -> Any:
        # made only for a build that is tried: a lighter build that is never needed leaves no folder
        Path(arguments["build_directory"]).mkdir(parents=True, exist_ok=True)
        return original(**arguments)

    @functools.wraps(original)
    def build(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # torch reports the bad call itself
        arguments = dict(bound.arguments)
        mode = os.environ.get("KFORGE_INLINE_BUILD", "fast")
        if function_name == "load_inline" and mode != "plain":
            cache = os.environ.get("KFORGE_KERNEL_CACHE")
            arguments = _with_header(arguments, Path(cache) if cache else None)
            lighter = []  # the lighter builds, tried in order before the source as written
            if mode == "split" and (halved := _halved(arguments)):
                lighter.append(_with_shadow(in_own_directory(halved)))
            if (trimmed := _trimmed(arguments)) != arguments:
                lighter.append(in_own_directory(trimmed))
            for attempt in lighter:
                try:
                    return built(attempt)
                except Exception as exc:  # noqa: BLE001 - built again as written below: its own error, if any
                    tail = " ".join(str(exc).split())[-300:]
                    print(f"kforge: a lighter build of {arguments.get('name')} failed ({tail})", file=sys.stderr)
                    # torch would call the second build of the same name `<name>_v1` in its messages
                    cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(arguments.get("name"), None)
        return built(in_own_directory(arguments))

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
