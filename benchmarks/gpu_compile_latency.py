"""CUDA compile latency per candidate: kforge's two fast paths (nvcc and NVRTC) against KernelBench's load_inline.

    python benchmarks/gpu_compile_latency.py [--no-gpu] [--kernels relu,gelu] [--load-inline concurrent|auto|sequential]

Five kernels, the CUDA references of five smoke problems (`kernels_ref/cuda/1_*.py`), each built
three ways from the same source: as it is through `load_cuda` (nvcc -> shared object, ctypes
launchers); its `__global__` functions alone, made `extern "C"`, through `load_cuda_kernels` (NVRTC
-> cubin in the calling process, driver-API launches); and through
`torch.utils.cpp_extension.load_inline` with a C++ wrapper taking `torch::Tensor` that calls the
same launcher on torch's current stream (a unique module name each time). Every compile runs in a
fresh subprocess with a fresh empty $KFORGE_KERNEL_CACHE and $TORCH_EXTENSIONS_DIR, so nothing is a
cache hit; the subprocess imports torch and initializes CUDA first and times only the load call
(`load s`: for NVRTC that includes loading libnvrtc, as a fresh worker would); its whole wall time
is reported apart. The warm-cache lookup is the same load call in another fresh subprocess over the
cache just filled. On a GPU each built kernel is checked against torch outside the timed region.

The nvcc and NVRTC compiles run one at a time. load_inline compiles (about a minute each) run all
at once by default, one subprocess per kernel (`--load-inline concurrent`), so the whole script
takes about 2.5 minutes on a 16-core host; `sequential` runs them one at a time (uncontended, about 4
minutes more); `auto` runs the first alone and the rest concurrently when the first shows that all
of them one at a time would take more than SEQUENTIAL_BUDGET_S. `--no-gpu` measures only the two
fast paths' compiles, on a host without a GPU.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEQUENTIAL_BUDGET_S = 120.0  # in auto mode: above this, the rest of the load_inline compiles run concurrently
MAX_CONCURRENT = 5

# The C++ side of load_inline: a torch::Tensor wrapper per kernel around the reference launcher.
INLINE_HEADER = "#include <torch/extension.h>\n#include <c10/cuda/CUDAStream.h>\n"
WRAPPERS = {
    "relu": r"""
torch::Tensor relu_tensor(torch::Tensor x) {
    auto y = torch::empty_like(x);
    relu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), c10::cuda::getCurrentCUDAStream());
    return y;
}""",
    "gelu": r"""
torch::Tensor gelu_tensor(torch::Tensor x) {
    auto y = torch::empty_like(x);
    gelu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), c10::cuda::getCurrentCUDAStream());
    return y;
}""",
    "softmax": r"""
torch::Tensor softmax_tensor(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    softmax(x.data_ptr<float>(), y.data_ptr<float>(), x.numel() / cols, cols, c10::cuda::getCurrentCUDAStream());
    return y;
}""",
    "layernorm": r"""
torch::Tensor layernorm_tensor(torch::Tensor x, double eps) {
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    layernorm(x.data_ptr<float>(), y.data_ptr<float>(), x.numel() / cols, cols, eps,
              c10::cuda::getCurrentCUDAStream());
    return y;
}""",
    "sum_dim": r"""
torch::Tensor sum_dim_tensor(torch::Tensor x, int64_t dim) {
    auto sizes = x.sizes().vec();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= sizes[d];
    for (int64_t d = dim + 1; d < (int64_t)sizes.size(); ++d) inner *= sizes[d];
    const int64_t reduced = sizes[dim];
    sizes.erase(sizes.begin() + dim);
    auto y = torch::empty(sizes, x.options());
    sum_dim(x.data_ptr<float>(), y.data_ptr<float>(), outer, reduced, inner, c10::cuda::getCurrentCUDAStream());
    return y;
}""",
}
KERNELS = list(WRAPPERS)


def reference_source(kernel: str) -> str:
    """The CUDA source string passed to load_cuda in kernels_ref/cuda/1_<kernel>.py."""
    tree = ast.parse((ROOT / "kernels_ref" / "cuda" / f"1_{kernel}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load_cuda":
            return node.args[0].value
    raise ValueError(f"kernels_ref/cuda/1_{kernel}.py has no load_cuda call")


def nvrtc_source(kernel: str) -> str:
    """The reference's device code for load_cuda_kernels: everything before the first host launcher
    (each reference ends with its launchers), every `__global__` function made `extern "C"`."""
    source = reference_source(kernel)
    return source[: source.index('extern "C" void')].replace("__global__ void", 'extern "C" __global__ void')


def inline_declaration(kernel: str) -> str:
    """`torch::Tensor f(args);`: the first line of the wrapper, for load_inline's cpp_sources."""
    return WRAPPERS[kernel].strip().splitlines()[0].rstrip(" {") + ";"


# ---- inside the child process -------------------------------------------------------------------


def check_kernel(kernel: str, call) -> None:
    """Run a built kernel once on the GPU through `call(name, x, *extra)` and compare with torch."""
    import torch

    x = torch.randn(64, 333, device="cuda")
    expected = {
        "relu": lambda: torch.relu(x),
        "gelu": lambda: torch.nn.functional.gelu(x),
        "softmax": lambda: torch.softmax(x, -1),
        "layernorm": lambda: torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-5),
        "sum_dim": lambda: x.view(8, 8, 333).sum(1),
    }[kernel]()
    torch.testing.assert_close(call(x), expected, atol=1e-4, rtol=1e-4)


def fast_call(lib, kernel: str, x):
    import torch

    if kernel == "sum_dim":
        y = torch.empty(8, 333, device="cuda")
        lib.sum_dim(x.view(8, 8, 333), y, 8, 8, 333)
        return y
    y = torch.empty_like(x)
    if kernel in ("relu", "gelu"):
        getattr(lib, kernel)(x, y, x.numel())
    elif kernel == "softmax":
        lib.softmax(x, y, x.shape[0], x.shape[1])
    else:
        lib.layernorm(x, y, x.shape[0], x.shape[1], 1e-5)
    return y


def nvrtc_call(kernels, kernel: str, x):
    """The launches the reference's host launcher makes, through load_cuda_kernels' kernels."""
    import torch

    rows, cols = x.shape
    if kernel == "sum_dim":
        y = torch.empty(8, 333, device="cuda")
        kernels.sum_dim_kernel(grid=(8 * 333 + 255) // 256, block=256, args=(x, y, 8, 8, 333))
        return y
    y = torch.empty_like(x)
    if kernel in ("relu", "gelu"):
        getattr(kernels, f"{kernel}_kernel")(grid=(x.numel() + 255) // 256, block=256, args=(x, y, x.numel()))
    elif kernel == "softmax":
        kernels.softmax_kernel(grid=rows, block=256, args=(x, y, cols))
    else:
        kernels.layernorm_kernel(grid=rows, block=256, args=(x, y, cols, 1e-5))
    return y


def inline_call(module, kernel: str, x):
    function = getattr(module, f"{kernel}_tensor")
    extra = {"layernorm": (1e-5,), "sum_dim": (1,)}.get(kernel, ())
    return function(x.view(8, 8, 333) if kernel == "sum_dim" else x, *extra)


def child(path: str, kernel: str, name: str, gpu: bool) -> None:
    """Time one load call (imports and CUDA initialization done first); print {"load_s": ...}."""
    import torch

    from tasks.harness.cuda import load_cuda
    from tasks.harness.nvrtc import load_cuda_kernels

    if gpu:
        torch.zeros(1, device="cuda")  # CUDA and its context initialized here, not inside the timed load
    source = reference_source(kernel)
    if path == "fast":
        start = time.perf_counter()
        built = load_cuda(source)
        load_s = time.perf_counter() - start
        call = lambda x: fast_call(built, kernel, x)  # noqa: E731
    elif path == "nvrtc":
        source = nvrtc_source(kernel)
        start = time.perf_counter()
        built = load_cuda_kernels(source)
        load_s = time.perf_counter() - start
        call = lambda x: nvrtc_call(built, kernel, x)  # noqa: E731
    else:
        from torch.utils.cpp_extension import load_inline

        start = time.perf_counter()
        built = load_inline(
            name=name,
            cpp_sources=inline_declaration(kernel),
            cuda_sources=INLINE_HEADER + source + WRAPPERS[kernel],
            functions=[f"{kernel}_tensor"],
        )
        load_s = time.perf_counter() - start
        call = lambda x: inline_call(built, kernel, x)  # noqa: E731
    if gpu:
        check_kernel(kernel, call)
    print(json.dumps({"load_s": load_s}), flush=True)
    os._exit(0)  # the worker skips interpreter teardown too


# ---- the parent ---------------------------------------------------------------------------------


def run_child(path: str, kernel: str, name: str, cache: Path, gpu: bool) -> tuple[float, float]:
    """(load s, subprocess wall s) of one load call in a fresh process over the cache dir `cache`."""
    env = dict(os.environ)
    env["KFORGE_KERNEL_CACHE"] = str(cache / "kforge")
    env["TORCH_EXTENSIONS_DIR"] = str(cache / "torch_extensions")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--child", path, kernel, name]
    if not gpu:
        command.append("--no-gpu")
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"{path} compile of {kernel} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    load_s = json.loads(lines[-1])["load_s"]
    print(f"  {path} {kernel}: load {load_s * 1000:.1f} ms, wall {wall_s:.2f} s", file=sys.stderr)
    return load_s, wall_s


def cold_and_warm(path: str, kernel: str, workdir: Path, gpu: bool) -> dict[str, float]:
    """A cold compile into a fresh empty cache, then a warm lookup over that cache (new processes)."""
    cache = Path(tempfile.mkdtemp(prefix=f"{path}-{kernel}-", dir=workdir))
    name = f"kforge_bench_{kernel}_{uuid.uuid4().hex[:12]}"
    cold_s, cold_wall_s = run_child(path, kernel, name, cache, gpu)
    warm_s, warm_wall_s = run_child(path, kernel, name, cache, gpu)
    return {"cold_s": cold_s, "cold_wall_s": cold_wall_s, "warm_s": warm_s, "warm_wall_s": warm_wall_s}


def load_inline_all(kernels: list[str], workdir: Path, mode: str) -> tuple[dict[str, dict[str, float]], str]:
    """Cold and warm load_inline per kernel, and a sentence saying how they were scheduled."""

    def concurrently(some: list[str]) -> list[dict[str, float]]:
        with ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT, len(some))) as pool:
            return list(pool.map(lambda k: cold_and_warm("inline", k, workdir, True), some))

    start = time.perf_counter()
    if mode == "concurrent":
        measured = concurrently(kernels)
        return dict(zip(kernels, measured)), (
            f"all {len(kernels)} concurrently, one subprocess each ({time.perf_counter() - start:.0f} s in all)"
        )
    first = cold_and_warm("inline", kernels[0], workdir, True)
    estimate_s = (time.perf_counter() - start) * len(kernels)
    rest = kernels[1:]
    if mode == "auto" and estimate_s > SEQUENTIAL_BUDGET_S and rest:
        measured = concurrently(rest)
        how = (
            f"the first ({kernels[0]}) alone, then the other {len(rest)} concurrently, one subprocess each "
            f"(all {len(kernels)} one at a time: ~{estimate_s / 60:.1f} min estimated from the first)"
        )
    else:
        measured = [cold_and_warm("inline", k, workdir, True) for k in rest]
        how = f"sequentially, one at a time ({time.perf_counter() - start:.0f} s in all)"
    return dict(zip(kernels, [first, *measured])), how


def machine_facts(gpu: bool) -> list[tuple[str, str]]:
    import torch

    from tasks.harness.cuda import cuda_arch, nvcc_version
    from tasks.harness.nvrtc import nvrtc_version

    facts = [
        ("date", time.strftime("%Y-%m-%d %H:%M %Z")),
        ("cpus", f"{os.cpu_count()} (usable: {len(os.sched_getaffinity(0))})"),
        ("python", platform.python_version()),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda})"),
        ("nvcc", nvcc_version()),
        ("nvrtc", nvrtc_version()),
        ("arch", cuda_arch()),
    ]
    if gpu:
        facts.insert(1, ("gpu", torch.cuda.get_device_name()))
    return facts


def fmt(value: float | None, digits: int = 2, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def median_of(measured: dict[str, dict[str, float]], key: str) -> float | None:
    return statistics.median(m[key] for m in measured.values()) if measured else None


PATHS = {"fast": "nvcc", "nvrtc": "NVRTC", "inline": "load_inline"}  # column labels


def ratio(measured: dict, numerator: str, denominator: str, kernel: str) -> float | None:
    """Cold load s of path `numerator` over path `denominator` for `kernel`; None if either is missing."""
    if kernel not in measured[numerator] or kernel not in measured[denominator]:
        return None
    return measured[numerator][kernel]["cold_s"] / measured[denominator][kernel]["cold_s"]


def median_ratio(measured: dict, numerator: str, denominator: str, kernels: list[str]) -> float | None:
    ratios = [r for k in kernels if (r := ratio(measured, numerator, denominator, k)) is not None]
    return statistics.median(ratios) if ratios else None


def cold_rows(kernels: list[str], measured: dict[str, dict]) -> list[list[str]]:
    """kernel, each path's load s, nvcc/NVRTC and load_inline/NVRTC, each path's wall s; then the medians."""
    rows = []
    for k in kernels:
        loads = [fmt(measured[p][k]["cold_s"] if k in measured[p] else None) for p in PATHS]
        ratios = [fmt(ratio(measured, p, "nvrtc", k), 1) for p in ("fast", "inline")]
        walls = [fmt(measured[p][k]["cold_wall_s"] if k in measured[p] else None) for p in PATHS]
        rows.append([k, *loads, *ratios, *walls])
    loads = [fmt(median_of(measured[p], "cold_s")) for p in PATHS]
    ratios = [fmt(median_ratio(measured, p, "nvrtc", kernels), 1) for p in ("fast", "inline")]
    walls = [fmt(median_of(measured[p], "cold_wall_s")) for p in PATHS]
    return [*rows, ["median", *loads, *ratios, *walls]]


def warm_rows(kernels: list[str], measured: dict[str, dict]) -> list[list[str]]:
    """kernel, each path's warm lookup ms and wall s; then the medians."""
    rows = []
    for k in kernels:
        loads = [fmt(measured[p].get(k, {}).get("warm_s"), 1, 1000) for p in PATHS]
        rows.append([k, *loads, *[fmt(measured[p].get(k, {}).get("warm_wall_s")) for p in PATHS]])
    loads = [fmt(median_of(measured[p], "warm_s"), 1, 1000) for p in PATHS]
    return [*rows, ["median", *loads, *[fmt(median_of(measured[p], "warm_wall_s")) for p in PATHS]]]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))


def main() -> None:
    if "--child" in sys.argv:
        path, kernel, name = sys.argv[sys.argv.index("--child") + 1 :][:3]
        child(path, kernel, name, gpu="--no-gpu" not in sys.argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-gpu", action="store_true", help="the fast paths' compiles only, on a host without a GPU")
    parser.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, from {','.join(KERNELS)}")
    parser.add_argument("--load-inline", choices=["auto", "sequential", "concurrent"], default="concurrent")
    args = parser.parse_args()
    kernels = args.kernels.split(",")
    import torch

    gpu = not args.no_gpu
    if shutil.which("nvcc") is None:
        print("nvcc not found on PATH: nothing to measure (install the CUDA toolkit). Skipped.")
        return
    if gpu and not torch.cuda.is_available():
        print("no CUDA GPU visible: skipped (--no-gpu measures the fast paths' nvcc and NVRTC compiles alone).")
        return
    for key, value in machine_facts(gpu):
        print(f"{key:8} {value}")
    print()

    with tempfile.TemporaryDirectory(prefix="kforge-bench-gpu-compile-") as workdir:
        measured = {
            path: {k: cold_and_warm(path, k, Path(workdir), gpu) for k in kernels} for path in ("fast", "nvrtc")
        }
        measured["inline"], how = load_inline_all(kernels, Path(workdir), args.load_inline) if gpu else ({}, "")

    labels = list(PATHS.values())
    print("cold compile (fresh subprocess, fresh empty caches); s: the load call alone; wall s: the whole subprocess")
    print("nvcc: load_cuda (nvcc -> shared object); NVRTC: load_cuda_kernels (NVRTC -> cubin); ratios over NVRTC")
    header = [
        "kernel",
        *[f"{c} s" for c in labels],
        "nvcc/NVRTC",
        "load_inline/NVRTC",
        *[f"{c} wall s" for c in labels],
    ]
    print_table(header, cold_rows(kernels, measured))
    print()
    print("warm-cache lookup (the same load call in another fresh subprocess, over the cache just filled)")
    print_table(
        ["kernel", *[f"{c} ms" for c in labels], *[f"{c} wall s" for c in labels]], warm_rows(kernels, measured)
    )
    print()
    medians = {p: fmt(median_of(measured[p], "cold_s")) for p in PATHS}
    print(f"n = {len(kernels)} kernels; median cold load: nvcc {medians['fast']} s, NVRTC {medians['nvrtc']} s", end="")
    if gpu:
        print(f", load_inline {medians['inline']} s")
        print(f"load_inline compiles ran {how}.")
        inline_over_fast = median_ratio(measured, "inline", "fast", kernels)
        print(f"median ratio load_inline / nvcc per kernel: {fmt(inline_over_fast, 1)}x")
    else:
        print("\n--no-gpu: the two fast paths' compiles only; load_inline needs a CUDA build of torch and a GPU")


if __name__ == "__main__":
    main()
