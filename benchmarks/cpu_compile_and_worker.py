"""CPU compile time and per-candidate worker overhead, measured side by side in one run.

    python benchmarks/cpu_compile_and_worker.py [--repeats N]

1. Compile time of one small elementwise kernel (y = x * sigmoid(x) over n floats) through
   kforge's g++ fast path (`tasks.harness.cpu.compile_cpp`, a fresh empty kernel cache each
   repeat) and through `torch.utils.cpp_extension.load_inline` (a fresh build directory and a
   unique module name each repeat), plus the fast path's warm-cache lookup (same source again).
   Both run in-process, in this process, one after the other; the first repeat of each also pays
   its one-time compiler checks (`g++ --version` and the like), visible in the max column.
2. Wall time of `run_worker` (via `evaluate_in_worker`) for mode 'compile' of a candidate whose
   kernel is already cached, against a fresh `python -c "import torch"` (the floor of any fresh
   worker) and a bare `python -c pass`.

Machine facts come first; everything else is median, min and max over N repeats (default 3).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from kforge.config import RunConfig
from tasks.harness.cpu import compile_cpp, load_cpp, toolchain_version
from tasks.judge import evaluate_in_worker

KERNEL_BODY = r"""
#include <cmath>
#include <cstdint>
extern "C" void silu(const float* x, float* y, int64_t n) {
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.f + std::exp(-x[i]));
}
"""

TORCH_WRAPPER = r"""
torch::Tensor silu_tensor(torch::Tensor x) {
    auto y = torch::empty_like(x);
    silu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""

PROBLEM_SOURCE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.silu(x)

def get_inputs():
    return [torch.randn(16, 4096)]

def get_init_inputs():
    return []
"""

CANDIDATE_SOURCE = f"""
import torch
import torch.nn as nn
from kforge.kernels import load_cpp

lib = load_cpp({KERNEL_BODY!r})

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        lib.silu(x, y, x.numel())
        return y
"""

# load_inline gets the fast path's optimisation flags, so only the build route differs
TORCH_CFLAGS = ["-O3", "-march=native", "-fopenmp"]


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - start, value


def machine_facts() -> list[tuple[str, str]]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return [
        ("date", time.strftime("%Y-%m-%d %H:%M %Z")),
        ("cpus", f"{os.cpu_count()} (usable: {len(os.sched_getaffinity(0))})"),
        ("cpu model", model),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("g++", toolchain_version()),
    ]


def check_silu(fn) -> None:
    x = torch.randn(1000)
    torch.testing.assert_close(fn(x), torch.nn.functional.silu(x))


def fast_path_compile(repeats: int) -> tuple[list[float], list[float]]:
    """Cold compiles, each into a fresh cache, and warm lookups of the same source."""
    cold, warm = [], []
    saved = os.environ.get("KFORGE_KERNEL_CACHE")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kforge-bench-cache-") as cache:
            os.environ["KFORGE_KERNEL_CACHE"] = cache
            cold.append(timed(compile_cpp, KERNEL_BODY)[0])
            warm.append(timed(compile_cpp, KERNEL_BODY)[0])
            lib = load_cpp(KERNEL_BODY)
            check_silu(lambda x: _call_into_new(lib.silu, x))  # noqa: B023 (called right here)
    os.environ.pop("KFORGE_KERNEL_CACHE")
    if saved is not None:
        os.environ["KFORGE_KERNEL_CACHE"] = saved
    return cold, warm


def _call_into_new(fn, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    fn(x, y, x.numel())
    return y


def load_inline_compile(repeats: int) -> list[float]:
    """Full torch extension builds, each in a fresh build directory under a unique name."""
    times = []
    for i in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kforge-bench-ext-") as build:
            seconds, module = timed(
                load_inline,
                name=f"kforge_bench_silu_{os.getpid()}_{i}",
                cpp_sources=KERNEL_BODY + TORCH_WRAPPER,
                functions=["silu_tensor"],
                extra_cflags=TORCH_CFLAGS,
                extra_ldflags=["-fopenmp"],
                build_directory=build,
            )
            times.append(seconds)
            check_silu(module.silu_tensor)
    return times


def worker_overhead(repeats: int) -> tuple[float, list[float], list[float]]:
    """One cold worker (fills the cache), then `repeats` warm ones; wall and in-worker compile_s."""
    with tempfile.TemporaryDirectory(prefix="kforge-bench-worker-") as cache:
        config = RunConfig(cache_dir=cache)
        cold = _compile_in_worker(config)[0]
        walls, inside = [], []
        for _ in range(repeats):
            seconds, compile_s = _compile_in_worker(config)
            walls.append(seconds)
            inside.append(compile_s)
    return cold, walls, inside


def _compile_in_worker(config: RunConfig) -> tuple[float, float]:
    seconds, result = timed(evaluate_in_worker, "compile", PROBLEM_SOURCE, CANDIDATE_SOURCE, config)
    if result["outcome"] != "correct":
        raise RuntimeError(f"worker failed: {result}")
    return seconds, result["compile_s"]


def fresh_python(code: str, repeats: int) -> list[float]:
    """Wall time of a fresh `python -c code`."""
    return [timed(subprocess.run, [sys.executable, "-c", code], check=True)[0] for _ in range(repeats)]


def import_torch_inside(repeats: int) -> list[float]:
    """Seconds `import torch` takes inside a fresh `python -c`, as that process reports it."""
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    run = [sys.executable, "-c", code]
    return [float(subprocess.run(run, check=True, capture_output=True, text=True).stdout) for _ in range(repeats)]


def row(name: str, how: str, samples: list[float]) -> list[str]:
    values = [statistics.median(samples), min(samples), max(samples)]
    return [name, how, *[f"{v * 1000:.1f}" for v in values], str(len(samples))]


def print_table(rows: list[list[str]]) -> None:
    header = ["measurement", "how", "median ms", "min ms", "max ms", "n"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    for key, value in machine_facts():
        print(f"{key:10} {value}")
    print()

    fast_cold, fast_warm = fast_path_compile(repeats)
    inline = load_inline_compile(repeats)
    worker_cold, worker_walls, worker_inside = worker_overhead(repeats)
    import_torch = import_torch_inside(repeats)
    # the worker ends with os._exit(0), so its floor skips interpreter teardown too
    torch_process = fresh_python("import os, torch; os._exit(0)", repeats)
    bare_python = fresh_python("pass", repeats)

    startup = [w - c for w, c in zip(worker_walls, worker_inside)]
    print_table(
        [
            row("compile: g++ fast path", "in-process, empty cache", fast_cold),
            row("compile: load_inline", "in-process, fresh build dir", inline),
            row("lookup: g++ fast path", "in-process, warm cache", fast_warm),
            row("worker 'compile', cold cache", "run_worker subprocess", [worker_cold]),
            row("worker 'compile', warm cache", "run_worker subprocess", worker_walls),
            row("  of which in-worker compile_s", "import candidate + ModelNew", worker_inside),
            row("  of which start-up and rest", "wall - compile_s", startup),
            row("import torch", "inside a fresh python -c", import_torch),
            row("python -c 'import torch'", "fresh subprocess, os._exit", torch_process),
            row("python -c pass", "fresh subprocess", bare_python),
        ]
    )
    print()
    ratio = statistics.median(inline) / statistics.median(fast_cold)
    share = statistics.median(startup) / statistics.median(worker_walls)
    print(f"load_inline / g++ fast path (median compile): {ratio:.1f}x")
    print(f"start-up share of a warm-cache worker 'compile': {share:.1%}")


if __name__ == "__main__":
    main()
