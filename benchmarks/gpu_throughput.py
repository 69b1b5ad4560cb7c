"""Candidates fully evaluated (compile + verify + time) per GPU-hour, three ways side by side in one run.

    python benchmarks/gpu_throughput.py [--candidates N] [--parallel P]

1. fresh: one new worker process per stage (python -m tasks.harness.worker), one candidate after
   another: what every stage pays without a pool.
2. pool: workers started ahead of need (torch imported, CUDA context made; `worker_pool`), still
   one process per stage, one candidate after another.
3. pool + parallel: P candidates at a time from a thread pool; compiles run side by side on the
   CPU cores while verify and time hold the GPU slot one at a time (`tasks.isolate._gpu_slot`).

Candidates are the level-1 CUDA reference kernels (relu, gelu, softmax, layernorm, sum over a
dim, at the problems' "gpu" sizes) made distinct by a comment in their CUDA source, so every
candidate is really compiled by nvcc (an empty kernel cache per configuration). The run's real
protocol is used: RunConfig defaults (3 correctness trials, warm-up, 10 to 100 timed runs within
1 s, L2 flush between runs).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge.config import RunConfig  # noqa: E402
from tasks.isolate import evaluate_in_worker  # noqa: E402

PROBLEMS = ("1_relu", "1_gelu", "1_softmax", "1_layernorm", "1_sum_dim")


def candidates(count: int, tag: str) -> list[tuple[str, str, str]]:
    """(problem id, problem source, distinct candidate source) for `count` candidates."""
    made = []
    for index, problem_id in zip(range(count), itertools.cycle(PROBLEMS)):
        problem = (ROOT / "data" / "problems" / "smoke" / f"{problem_id}.py").read_text()
        kernel = (ROOT / "kernels_ref" / "cuda" / f"{problem_id}.py").read_text()
        distinct = kernel.replace('load_cuda(r"""', f'load_cuda(r"""\n// {tag} candidate {index}', 1)
        assert distinct != kernel, problem_id
        made.append((problem_id, problem, distinct))
    return made


def evaluate(problem: str, candidate: str, config: RunConfig) -> tuple[str, dict[str, float]]:
    """Outcome and per-stage wall time of one candidate through compile, verify and time."""
    stage_s = {}
    for mode in ("compile", "verify", "time"):
        start = time.perf_counter()
        result = evaluate_in_worker(mode, problem, candidate, config)
        stage_s[mode] = time.perf_counter() - start
        if result["outcome"] != "correct":
            return f"{mode}: {result['outcome']} {result.get('error_class')}", stage_s
    return "correct", stage_s


def measure(name: str, count: int, parallel: int, pool: int) -> dict[str, object]:
    cache = tempfile.mkdtemp(prefix=f"kforge-bench-{name}-")
    config = RunConfig(backend="cuda", cache_dir=cache, worker_pool=pool, base_seed=11)
    work = candidates(count, name)
    if pool:  # let the first spares start, as they would have during an earlier candidate
        evaluate_in_worker("compile", work[0][1], "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n", config)
        time.sleep(5)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as threads:
        results = list(threads.map(lambda c: evaluate(c[1], c[2], config), work))
    elapsed = time.perf_counter() - start
    failures = [outcome for outcome, _ in results if outcome != "correct"]
    per_stage = {mode: statistics.median(s[mode] for _, s in results if mode in s) for mode in results[0][1]}
    return {
        "name": name,
        "candidates": count,
        "parallel": parallel,
        "pool": pool,
        "elapsed_s": elapsed,
        "per_hour": count / elapsed * 3600,
        "failures": failures,
        "stage_median_s": per_stage,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    print(f"GPU: {gpu}; torch {torch.__version__}; CPU cores: {len(__import__('os').sched_getaffinity(0))}")
    rows = [
        measure("fresh", max(5, args.candidates // 2), parallel=1, pool=0),
        measure("pool", args.candidates, parallel=1, pool=2),
        measure("pool+parallel", args.candidates * 2, parallel=args.parallel, pool=args.parallel + 2),
    ]
    print(
        f"\n{'configuration':<16}{'candidates':>11}{'parallel':>9}{'elapsed s':>11}{'per GPU-hour':>14}"
        f"{'compile s':>11}{'verify s':>10}{'time s':>8}  failures"
    )
    for row in rows:
        stage = row["stage_median_s"]
        print(
            f"{row['name']:<16}{row['candidates']:>11}{row['parallel']:>9}{row['elapsed_s']:>11.1f}"
            f"{row['per_hour']:>14.0f}{stage.get('compile', 0):>11.2f}{stage.get('verify', 0):>10.2f}"
            f"{stage.get('time', 0):>8.2f}  {row['failures'] or 'none'}"
        )
    print(
        f"\npool / fresh: {rows[1]['per_hour'] / rows[0]['per_hour']:.2f}x; "
        f"pool+parallel / fresh: {rows[2]['per_hour'] / rows[0]['per_hour']:.2f}x (stage times are medians, "
        "wall time per stage including any wait for the GPU slot)"
    )


if __name__ == "__main__":
    main()
