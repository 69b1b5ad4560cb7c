"""A load_inline candidate's CUDA source split in two: its kernels for nvcc, its host code for g++.

nvcc spends most of a KernelBench-style build parsing torch's headers (torch/types.h, which
load_inline puts on top of cuda_sources, and the candidate's own torch/extension.h) for host
functions that only call a kernel: on an H200 host the CUDA part took 33-37 s where the kernels
alone take about 3. Split, the kernels and their device helpers go to cuda_sources with one launch
function per kernel (`kforge_launch_<kernel>`, plain C++ types only), and the host functions, whose
`kernel<<<grid, block[, shared[, stream]]>>>(args)` become calls of those launch functions, go
after cpp_sources into load_inline's main.cpp, which g++ builds with the precompiled
torch/extension.h (tasks/harness/extensions.py). The same statements run in the same order.

Only sources whose shape is plain are split; anything else (templated kernels, conditional
compilation, namespaces, a launch that names no kernel of the file, device code that mentions
torch) gives None and the source is built as before. The caller builds it as written whenever the
split build fails, so a candidate's compile error is always its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LAUNCH_PREFIX = "kforge_launch_"
# Headers the host half keeps (torch's, pybind11's): the kernels' half never needs them.
HOST_HEADERS = re.compile(r"#\s*include\s*[<\"](torch|ATen|c10|pybind11)/")
TORCH_WORDS = re.compile(r"\b(torch|at|c10|pybind11)::|\bTORCH_\w+|\bAT_\w+|\bC10_\w+")
DEVICE_WORDS = re.compile(r"\b(__global__|__device__|__constant__|__shared__|__managed__)\b")
REFUSED = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b|\bnamespace\b|\bextern\s*\"C\"\s*\{|\btemplate\b")
KERNEL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(")
TYPE_WORDS = re.compile(
    r"^\s*(struct|class|union|enum|typedef|using|constexpr|static\s+constexpr|static\s+const|const)\b"
)


@dataclass
class Kernel:
    name: str
    parameters: str  # as written, between the parentheses
    names: list[str]  # the parameters' names, in order


def _strip_comments(source: str) -> str:
    """The source without comments (string and character literals kept as they are)."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)
    return pattern.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else " ", source)


def _closing(text: str, start: int, opening: str, closing: str) -> int:
    """The index just past the bracket that closes the one at `start` (-1 if none)."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] == opening:
            depth += 1
        elif text[index] == closing:
            depth -= 1
            if depth == 0:
                return index + 1
    return -1


def _top_level(source: str) -> list[str] | None:
    """Preprocessor lines and top-level declarations, in order (None where braces do not balance).
    A declaration ends at a ';' at depth 0, or at the '}' that closes its body (a struct's, enum's
    or initializer's at the ';' after it); preprocessor lines inside a body stay in it."""
    chunks: list[str] = []
    pending, depth, waits_for_semicolon = "", 0, False
    lines = source.split("\n")
    index = 0
    while index < len(lines):
        line = lines[index]
        if depth == 0 and not pending.strip() and line.lstrip().startswith("#"):
            block = [line]
            while block[-1].endswith("\\") and index + 1 < len(lines):
                index += 1
                block.append(lines[index])
            chunks.append("\n".join(block))
            index += 1
            continue
        for char in line + "\n":
            pending += char
            if char == "{":
                if depth == 0:
                    head = pending[: pending.index("{")]
                    # a type's or an initializer's braces end at a ';' (a function's default arguments are not one)
                    initializer = "=" in head.split("(")[0]
                    waits_for_semicolon = initializer or bool(re.search(r"\b(struct|class|union|enum)\b", head))
                depth += 1
            elif char == "}":
                depth -= 1
                if depth < 0:
                    return None
                if depth == 0 and not waits_for_semicolon:
                    chunks.append(pending)
                    pending = ""
            elif char == ";" and depth == 0:
                chunks.append(pending)
                pending, waits_for_semicolon = "", False
        index += 1
    if depth or pending.strip():
        return None
    return [chunk for chunk in chunks if chunk.strip()]


def _parameter_names(parameters: str) -> list[str] | None:
    if not parameters.strip() or parameters.strip() == "void":
        return []
    names = []
    for parameter in _split_commas(parameters):
        if "(" in parameter or "[" in parameter or "=" in parameter:
            return None
        match = re.search(r"(\w+)\s*$", parameter)
        if not match or len(parameter.split()) < 2 and "*" not in parameter and "&" not in parameter:
            return None
        names.append(match.group(1))
    return names


def _split_commas(text: str) -> list[str]:
    """`text` split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part.strip() for part in parts]


def _kernel(chunk: str) -> Kernel | None:
    match = KERNEL.search(chunk)
    if not match:
        return None
    end = _closing(chunk, match.end() - 1, "(", ")")
    if end < 0:
        return None
    parameters = chunk[match.end() : end - 1]
    names = _parameter_names(parameters)
    if names is None:
        return None
    return Kernel(match.group(1), " ".join(parameters.split()), names)


def _rewrite_launches(chunk: str, kernels: dict[str, Kernel]) -> str | None:
    """`chunk` with each `kernel<<<...>>>(...)` a call of its launch function (None where a launch
    names no kernel of the file or its configuration is not 2-4 arguments)."""
    out, index = [], 0
    while (at := chunk.find("<<<", index)) >= 0:
        name = re.search(r"(\w+)\s*$", chunk[index:at])
        close = chunk.find(">>>", at)
        if not name or name.group(1) not in kernels or close < 0:
            return None
        configuration = _split_commas(chunk[at + 3 : close])
        if not 2 <= len(configuration) <= 4 or not all(configuration):
            return None
        configuration += ["0", "0"][: 4 - len(configuration)]
        opening = re.match(r"\s*\(", chunk[close + 3 :])
        if not opening:
            return None
        args_start = close + 3 + opening.end() - 1
        args_end = _closing(chunk, args_start, "(", ")")
        if args_end < 0:
            return None
        arguments = chunk[args_start + 1 : args_end - 1]
        grid, block, shared, stream = configuration
        call_args = ", ".join([f"dim3({grid})", f"dim3({block})", f"(size_t)({shared})", f"(cudaStream_t)({stream})"])
        if arguments.strip():
            call_args += ", " + arguments
        out.append(chunk[index : index + name.start()] + f"{LAUNCH_PREFIX}{name.group(1)}({call_args})")
        index = args_end
    out.append(chunk[index:])
    return "".join(out)


def _launcher(kernel: Kernel, named: bool) -> str:
    """The launch function's signature (`named`: with parameter names, for its definition)."""
    head = "dim3 grid, dim3 block, size_t shared, cudaStream_t stream" if named else "dim3, dim3, size_t, cudaStream_t"
    parameters = f", {kernel.parameters}" if kernel.names else ""
    return f"void {LAUNCH_PREFIX}{kernel.name}({head}{parameters})"


def split(cuda_source: str) -> tuple[str, str] | None:
    """(the kernels' half for cuda_sources, the host half to follow cpp_sources), or None where the
    source is not of a shape this splits safely."""
    source = _strip_comments(cuda_source)
    if "<<<" not in source or any(REFUSED.search(line) for line in source.split("\n")):
        return None
    chunks = _top_level(source)
    if not chunks:
        return None
    kernels: dict[str, Kernel] = {}
    # what the shadowed torch/types.h brought the kernels that they may use: int64_t, size_t
    device_half, host_half = ["#include <cstddef>", "#include <cstdint>"], ["#include <cuda_runtime.h>"]
    for chunk in (chunk.strip() for chunk in chunks):
        if chunk.startswith("#"):
            if HOST_HEADERS.match(chunk):
                host_half.append(chunk)
            elif not re.match(r"#\s*pragma\s+once", chunk):
                device_half.append(chunk)  # other headers and macros: both halves
                host_half.append(chunk)
        elif "__global__" in chunk:
            kernel = _kernel(chunk)
            if kernel is None or TORCH_WORDS.search(chunk) or "<<<" in chunk:
                return None
            kernels[kernel.name] = kernel
            device_half.append(chunk)
            host_half.append(_launcher(kernel, named=False) + ";")
        elif DEVICE_WORDS.search(chunk):
            if TORCH_WORDS.search(chunk) or "<<<" in chunk:
                return None
            device_half.append(chunk)
        elif _is_type_or_constant(chunk):
            device_half.append(chunk)
            host_half.append(chunk)
        else:  # host code
            rewritten = _rewrite_launches(chunk, kernels) if "<<<" in chunk else chunk
            if rewritten is None:
                return None
            host_half.append(rewritten)
    if not kernels:
        return None
    for kernel in kernels.values():
        launch = f"{kernel.name}<<<grid, block, shared, stream>>>({', '.join(kernel.names)});"
        device_half.append(f"{_launcher(kernel, named=True)} {{\n    {launch}\n}}")
    return "\n".join(device_half) + "\n", "\n".join(host_half) + "\n"


def _is_type_or_constant(chunk: str) -> bool:
    """A type, a constant or a constexpr function (inline, and callable from device code with
    torch's --expt-relaxed-constexpr), which either half may use, and no torch in it."""
    if TORCH_WORDS.search(chunk) or not TYPE_WORDS.match(chunk):
        return False
    head = chunk.split("{")[0].split("=")[0]
    return "(" not in head or bool(re.match(r"\s*(static\s+)?constexpr\b", chunk))
