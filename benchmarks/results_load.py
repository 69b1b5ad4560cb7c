"""How long `kforge.results.load("attempts")` takes on a month of nightly results, before and after compaction.

    python benchmarks/results_load.py [--runs 30] [--problems 250] [--attempts 6] [--repeats 3] [--fsync]

Makes, in a temporary directory, ``--runs`` nightly runs (one date partition each) of ``--problems``
KernelBench-like problems with ``--attempts`` iterations each, one `attempts` file per attempt written
by `kforge.results.append_rows` as a run writes them (plus the two `runs` rows of each run), then
times `load("attempts", dir)`, best of ``--repeats``, compacts every partition (`kforge.compact`),
times the load again and checks that both loads return the same rows. Without ``--fsync`` the
files are the same bytes, but append_rows' fsync is skipped while generating: with it, 45,000
files take about 6 minutes here instead of 1.5.
Everything is in the page cache: the times are kforge's and pyarrow's per-file costs, not the disk's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge import results  # noqa: E402
from kforge.compact import compact  # noqa: E402

OUTCOMES = ["correct"] * 5 + ["compile_error"] * 2 + ["numerical_mismatch", "runtime_error", "timeout"]
FIRST_NIGHT = date(2026, 10, 1)


@contextlib.contextmanager
def fsync_skipped(skip: bool) -> Iterator[None]:
    real = os.fsync
    if skip:
        os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real


def candidate_source(rng: random.Random, problem: int, iteration: int) -> str:
    """A CUDA-kernel-sized candidate, 1.5 to 4 KB of code-like text."""
    body = "\n".join(
        f"    float v{k} = x[i * {rng.randint(1, 64)} + {k}] * {rng.random():.6f}f;" for k in range(rng.randint(20, 60))
    )
    return (
        "import torch\nfrom kforge.kernels import load_cuda\n\nlib = load_cuda(r'''\n"
        f'extern "C" __global__ void k{problem}_{iteration}(const float* x, float* y, long n) {{\n'
        f"  long i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i >= n) return;\n{body}\n  y[i] = v0;\n}}\n''')\n"
    )


def attempt_row(rng: random.Random, run_id: str, night: datetime, problem: int, iteration: int) -> dict:
    outcome = rng.choice(OUTCOMES)
    correct = outcome == "correct"
    eager = rng.uniform(0.05, 20.0)
    runtime = eager / rng.uniform(0.3, 4.0) if correct else None
    return {
        "attempt_id": f"{run_id[:8]}-{problem:03d}-{iteration}",
        "problem_id": f"level{1 + problem % 3}/{problem:03d}_problem",
        "problem_hash": f"{problem:016x}",
        "level": 1 + problem % 3,
        "suite": "kernelbench",
        "backend": "cuda",
        "device": "cuda",
        "size_preset": "gpu",
        "model": "gpt-x",
        "agent": "llm",
        "agent_config": {"temperature": 0.2, "max_tokens": 8192, "reference_shown": False},
        "max_iterations": 5,
        "performance_agent": True,
        "prompt_hash": uuid.UUID(int=rng.getrandbits(128)).hex,
        "reply_cached": False,
        "iteration": iteration,
        "rollout": 0,
        "parent_attempt": f"{run_id[:8]}-{problem:03d}-{iteration - 1}" if iteration else None,
        "outcome": outcome,
        "error_class": None if correct else outcome,
        "error_excerpt": None if correct else "Traceback (most recent call last):\n  ...\n" * 8,
        "source_hash": uuid.UUID(int=rng.getrandbits(128)).hex,
        "candidate_source": candidate_source(rng, problem, iteration),
        "compile_s": rng.uniform(0.1, 2.0),
        "runtime_ms": runtime,
        "runtime_p10_ms": runtime and runtime * 0.97,
        "runtime_p90_ms": runtime and runtime * 1.05,
        "eager_ms": eager,
        "compile_ms": eager * 0.8,
        "speedup_eager": runtime and eager / runtime,
        "speedup_compile": runtime and eager * 0.8 / runtime,
        "speedup_best": runtime and eager * 0.8 / runtime,
        "atol": 1e-4,
        "rtol": 1e-4,
        "allow_library_calls": False,
        "tokens_in": rng.randint(2000, 9000),
        "tokens_out": rng.randint(500, 4000),
        "cost_usd": rng.uniform(0.001, 0.05),
        "timing_source": "observed" if correct else None,
        "judged_seeds": str([rng.getrandbits(32) for _ in range(4)]) if correct else None,
        "isolation": '{"mount": true, "pid": true, "net": true}',
        "created_at": night + timedelta(seconds=problem * 60 + iteration * 10),
    }


def generate(results_dir: Path, runs: int, problems: int, attempts: int) -> int:
    rng = random.Random(13)
    files = 0
    for run in range(runs):
        day = FIRST_NIGHT + timedelta(days=run)
        night = datetime.combine(day, datetime.min.time(), tzinfo=timezone.utc) + timedelta(hours=1)
        run_id = str(uuid.UUID(int=rng.getrandbits(128)))
        run_row = {"status": "running", "started_at": night, "host": "gpu-box", "gpu_name": "H200"}
        results.append_rows(results_dir, "runs", [run_row], run_id=run_id, run_date=day)
        for problem in range(problems):
            for iteration in range(attempts):
                row = attempt_row(rng, run_id, night, problem, iteration)
                results.append_rows(results_dir, "attempts", [row], run_id=run_id, run_date=day)
                files += 1
        finished = {**run_row, "status": "finished", "finished_at": night + timedelta(hours=5)}
        results.append_rows(results_dir, "runs", [finished], run_id=run_id, run_date=day)
        print(f"  night {run + 1}/{runs}: {files} attempt files", file=sys.stderr, flush=True)
    return files


def timed_load(results_dir: Path, repeats: int):
    best, frame = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        frame = results.load("attempts", results_dir)
        best = min(best, time.perf_counter() - start)
    return best, frame


def count_files(results_dir: Path) -> int:
    return sum(1 for p in (results_dir / "attempts").glob("date=*/*.parquet") if not p.name.startswith((".", "_")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="nightly runs, one date partition each (default 30)")
    parser.add_argument("--problems", type=int, default=250, help="problems per run (default 250)")
    parser.add_argument("--attempts", type=int, default=6, help="attempts per problem (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="loads timed before and after; the best counts")
    parser.add_argument("--fsync", action="store_true", help="keep append_rows' fsync while generating (slower)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kforge-results-load-") as tmp:
        results_dir = Path(tmp)
        start = time.perf_counter()
        with fsync_skipped(not args.fsync):
            generate(results_dir, args.runs, args.problems, args.attempts)
        generate_s = time.perf_counter() - start
        files_before = count_files(results_dir)

        before_s, before = timed_load(results_dir, args.repeats)
        start = time.perf_counter()
        done = compact(results_dir)
        compact_s = time.perf_counter() - start
        files_after = count_files(results_dir)
        after_s, after = timed_load(results_dir, args.repeats)

        keys = ["attempt_id"]
        same = before.sort_values(keys).reset_index(drop=True).equals(after.sort_values(keys).reset_index(drop=True))
        if not same:
            raise SystemExit("the loads before and after compaction differ")

    fsync_note = "with fsync" if args.fsync else "fsync skipped"
    print(
        f"{args.runs} runs x {args.problems} problems x {args.attempts} attempts; generated in {generate_s:.0f} s "
        f"({fsync_note}); compacted {sum(c.changed for c in done)} partitions in {compact_s:.1f} s; "
        "loads returned the same rows"
    )
    print(f"{'':<16}{'files':>8}{'rows':>8}   load s (best of {args.repeats})")
    print(f"{'before compact':<16}{files_before:>8}{len(before):>8}   {before_s:>8.3f}")
    print(f"{'after compact':<16}{files_after:>8}{len(after):>8}   {after_s:>8.3f}")
    print(f"{'ratio':<16}{files_before / files_after:>8.0f}{'':>8}   {before_s / after_s:>8.1f}x faster")


if __name__ == "__main__":
    main()
