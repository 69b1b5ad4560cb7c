"""Run-to-run spread of the harness's timing on a GPU: the same kernel measured in 5 fresh workers.

    python benchmarks/gpu_timing_spread.py [--repeats N] [--calibration-steps N]

Two problems, one near each end of the runtimes that matter: 1_relu (a ~50 us memory-bound
elementwise kernel) and 1_matmul (the naive 16x16-tile kernel, ~5 ms), with their CUDA references
from kernels_ref/cuda. Each measurement is a separate `evaluate_in_worker("time", ...)` call: a
fresh worker process, the real protocol (tasks/harness/timing.py, the RunConfig defaults for
warm-up, runs and budget), the same seeds every time, so only the harness and the GPU vary. The
eager PyTorch reference is measured the same way (mode "baseline", torch.compile off), so the
harness's noise shows apart from the kernel's.

Problem sizes are written into the problem source (a SIZE_PRESETS["gpu"] override appended to the
smoke problem). The defaults land near the targets on an H100 (found with --calibration-steps 2);
on another GPU, --calibration-steps N first rescales them toward the target runtime, each step one
more "time" call (relu linearly in rows, matmul by the cube root).

Spread = (max median - min median) / mean median over the repeats; the target is under 2%.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kforge.config import RunConfig
from tasks.judge import evaluate_in_worker

ROOT = Path(__file__).resolve().parents[1]
TARGET_SPREAD = 0.02


@dataclass
class Case:
    problem: str  # smoke problem name; its kernels_ref/cuda file is the candidate
    target_ms: float
    sizes: dict[str, int]  # the SIZE_PRESETS["gpu"] the repeats use (defaults: measured on an H100)
    rescale: Callable[[dict[str, int], float], dict[str, int]]  # sizes, wanted / measured -> sizes

    def describe(self) -> str:
        return "x".join(str(v) for v in self.sizes.values())


def _round(value: float, step: int) -> int:
    return max(step, int(round(value / step)) * step)


CASES = [
    Case(
        "1_relu",
        0.05,
        {"batch_size": 1280, "dim": 4096},
        lambda sizes, factor: {**sizes, "batch_size": _round(sizes["batch_size"] * factor, 128)},
    ),
    Case(
        "1_matmul",
        5.0,
        {"M": 2752, "K": 2752, "N": 2752},
        lambda sizes, factor: dict.fromkeys(sizes, _round(sizes["M"] * factor ** (1 / 3), 64)),
    ),
]


def sources(case: Case) -> tuple[str, str]:
    """(problem source with the case's sizes as its gpu preset, candidate source)."""
    problem = (ROOT / "data" / "problems" / "smoke" / f"{case.problem}.py").read_text()
    problem += f"\n\nSIZE_PRESETS = {{'gpu': {case.sizes!r}}}\n"
    return problem, (ROOT / "kernels_ref" / "cuda" / f"{case.problem}.py").read_text()


def measure(mode: str, case: Case, config: RunConfig) -> dict[str, float]:
    """One fresh worker: {'median', 'p10', 'p90', 'worker_s'} in ms (worker_s in s)."""
    problem_source, candidate_source = sources(case)
    result = evaluate_in_worker(mode, problem_source, candidate_source if mode == "time" else None, config)
    if result["outcome"] != "correct":
        raise RuntimeError(f"{mode} of {case.problem} {case.describe()}: {result['outcome']}\n{result}")
    prefix = "runtime" if mode == "time" else "eager"
    print(f"  {mode} {case.problem} {case.describe()}: {result[f'{prefix}_ms']:.4f} ms", file=sys.stderr)
    return {
        "median": result[f"{prefix}_ms"],
        "p10": result[f"{prefix}_p10_ms"],
        "p90": result[f"{prefix}_p90_ms"],
        "runs": result.get("timed_runs"),
        "worker_s": result["worker_s"],
    }


def calibrate(case: Case, config: RunConfig, steps: int) -> list[str]:
    """Rescale case.sizes toward case.target_ms; one line of notes per step."""
    notes = []
    for _ in range(steps):
        measured = measure("time", case, config)["median"]
        before = case.describe()
        case.sizes = case.rescale(case.sizes, case.target_ms / measured)
        notes.append(f"{case.problem} {before}: {measured:.4f} ms -> {case.describe()}")
    return notes


def spread(medians: list[float]) -> float:
    return (max(medians) - min(medians)) / statistics.mean(medians)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calibration-steps", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: skipped (this benchmark times CUDA kernels in the evaluation worker).")
        return
    config_defaults = RunConfig(backend="cuda")
    print(f"date     {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"gpu      {torch.cuda.get_device_name()}")
    print(f"python   {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    print(
        f"protocol warm-up {config_defaults.warmup_runs}, runs {config_defaults.min_timed_runs}-"
        f"{config_defaults.max_timed_runs}, budget {config_defaults.timing_budget_s:g} s, L2 flushed each run"
    )
    print()

    rows, summary = [], []
    with tempfile.TemporaryDirectory(prefix="kforge-bench-spread-", ignore_cleanup_errors=True) as cache:
        # base_seed fixed: every repeat times the same inputs; the kernel cache is shared, so only
        # the first call compiles (outside the timed region anyway)
        config = RunConfig(backend="cuda", cache_dir=cache, base_seed=1, torch_compile_baseline=False)
        for case in CASES:
            for note in calibrate(case, config, args.calibration_steps):
                print(f"calibration: {note}")
            for mode, label in (("time", "kernel (cuda ref)"), ("baseline", "eager reference")):
                measured = [measure(mode, case, config) for _ in range(args.repeats)]
                for index, m in enumerate(measured, 1):
                    cells = [f"{m[key]:.4f}" for key in ("median", "p10", "p90")]
                    runs = str(m["runs"]) if m["runs"] else "-"
                    rows.append(
                        [case.problem, case.describe(), label, str(index), *cells, runs, f"{m['worker_s']:.1f}"]
                    )
                medians = [m["median"] for m in measured]
                within = statistics.mean((m["p90"] - m["p10"]) / m["median"] for m in measured)
                summary.append([case.problem, case.describe(), label, f"{statistics.mean(medians):.4f}"])
                summary[-1] += [f"{min(medians):.4f}", f"{max(medians):.4f}", f"{within:.1%}", f"{spread(medians):.2%}"]
                summary[-1].append("yes" if spread(medians) < TARGET_SPREAD else "NO")
    print()
    header = ["problem", "size", "timed", "repeat", "median ms", "p10 ms", "p90 ms", "runs", "worker s"]
    print_table(header, rows)
    print()
    header = ["problem", "size", "timed", "mean ms", "min ms", "max ms", "p90-p10", "spread", "< 2%"]
    print_table(header, summary)
    print()
    print("spread = (max median - min median) / mean median over the repeats, each a fresh worker;")
    print("p90-p10 = the mean within-run (p90 - p10) / median, for comparison.")


if __name__ == "__main__":
    main()
