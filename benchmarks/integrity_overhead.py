"""What the trust boundary costs: the checks' share of one candidate's evaluation.

    python benchmarks/integrity_overhead.py [--backend cpu|cuda|triton] [--samples 3]

For each smoke problem, the reference kernel of the backend (kernels_ref/<backend>/) goes through
compile, verify, baseline and time with RunConfig's defaults (no torch.compile baseline), as
`kforge run` evaluates it. The orchestrator's session driver (tasks/drive.py) times its checks from
its own clock, by kind, and returns them in each stage's `check_s`:

    inputs         making each call's inputs from a fresh seed and writing them into the worker
    judge          copying outputs out of the worker, the reference's outputs, the comparisons
    watch          reading the worker's CPU time between calls (/proc schedstat)
    echo           the empty calls that bound the claimed times
    watched_calls  the timed calls that also record ops and poison allocations (not timed)

The share is their sum over the stages' wall time (worker start included), per problem; the
table prints each problem's median over the samples and the median and max over problems.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge.config import RunConfig  # noqa: E402
from tasks.judge import evaluate_in_worker  # noqa: E402

KINDS = ("inputs", "judge", "watch", "echo", "watched_calls")


def measure(problem: Path, kernel: Path, config: RunConfig) -> tuple[float, dict[str, float]]:
    """(wall seconds of compile + verify + baseline + time, check seconds by kind) for one candidate."""
    problem_source, kernel_source = problem.read_text(), kernel.read_text()
    wall, checks = 0.0, dict.fromkeys(KINDS, 0.0)
    baseline = None
    for stage in ("compile", "verify", "baseline", "time"):
        trusted = baseline or {}
        candidate = None if stage == "baseline" else kernel_source
        echoes = (trusted.get("echo_ms"), trusted.get("echo_cpu_ms"))
        result = evaluate_in_worker(stage, problem_source, candidate, config, *echoes)
        if result["outcome"] != "correct":
            raise SystemExit(f"{problem.name}: {stage} gave {result['outcome']}: {result.get('error_excerpt')}")
        baseline = result if stage == "baseline" else baseline
        wall += result.get("worker_s", 0.0)
        for kind, seconds in (result.get("check_s") or {}).items():
            checks[kind] = checks.get(kind, 0.0) + seconds
    return wall, checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "triton"])
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    config = RunConfig(backend=args.backend, torch_compile_baseline=False, cache_dir="data/cache")
    rows = []
    for kernel in sorted((ROOT / "kernels_ref" / args.backend).glob("*.py")):
        problem = ROOT / "data" / "problems" / "smoke" / kernel.name
        if not problem.exists():
            continue
        shares, parts = [], []
        for _ in range(args.samples):
            wall, checks = measure(problem, kernel, config)
            shares.append(sum(checks.values()) / wall)
            parts.append(checks)
        by_kind = {kind: statistics.median(p.get(kind, 0.0) for p in parts) for kind in KINDS}
        rows.append((kernel.stem, statistics.median(shares), by_kind))
    print(f"| problem ({args.backend}) | checks' share | " + " | ".join(f"{k} s" for k in KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for name, share, by_kind in rows:
        print(f"| {name} | {share:.1%} | " + " | ".join(f"{by_kind[k]:.3f}" for k in KINDS) + " |")
    shares = [share for _, share, _ in rows]
    print(f"\nmedian {statistics.median(shares):.1%}, max {max(shares):.1%} over {len(rows)} problems")


if __name__ == "__main__":
    main()
