"""KernelBench levels 1-3 through `kforge run` with the identity candidate (each problem's reference
as its own candidate: speedups should be 1.00), the problems unchanged from a KernelBench checkout.

    python benchmarks/kernelbench_suite.py [--kernelbench ../shared/kernelbench] [--levels 1,2,3]
        [--slice 0:50] [--backend cuda] [--rerun] [--parallel-problems N] [--timeout S] [--out DIR] [--trace]
        [--config FILE [--config FILE ...]]

For each level, the selected files (sorted by KernelBench's problem number; `--slice` picks a range
of them, so a device call can take a part) are linked into a suite folder `level<N>` and run with
`python -m kforge.cli run --agent identity --iterations 0` in a subprocess: the CLI a user runs,
its ephemeral Prefect included. `--rerun` runs the same command again over the same cache (a
nightly rerun: baselines and reference outputs come from the cache) and prints both side by side.

Printed per run: problems, judged (a verdict recorded), correct, the other outcomes with their
reasons, problems without a row and why (the run's summary), the identity speedup distribution
against eager (min, p5, median, p95, max, and how many lie within +-2%), wall time and candidates
fully judged per GPU-hour (wall time of the whole command, start-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from kforge import results  # noqa: E402
from tasks import trace  # noqa: E402


def problem_number(path: Path) -> int:
    head = path.stem.split("_", 1)[0]
    return int(head) if head.isdigit() else 10**6


def make_suite(kernelbench: Path, level: int, selection: slice, where: Path) -> Path:
    folder = kernelbench / f"level{level}"
    if not folder.is_dir():
        raise SystemExit(f"error: {folder} is not a folder: give --kernelbench the KernelBench checkout's problems")
    files = sorted(folder.glob("*.py"), key=problem_number)[selection]
    suite = where / f"level{level}"
    suite.mkdir(parents=True)
    for path in files:
        (suite / path.name).symlink_to(path.resolve())
    return suite


def run_cli(
    suite: Path,
    args: argparse.Namespace,
    results_dir: Path,
    cache_dir: Path,
    trace_path: Path | None = None,
    settings: str | None = None,
) -> tuple[float, int, str]:
    command = [sys.executable, "-m", "kforge.cli", "run", "--agent", "identity", "--iterations", "0"]
    command += [
        "--suite",
        str(suite),
        "--backend",
        args.backend,
        "--results",
        str(results_dir),
        "--cache",
        str(cache_dir),
    ]
    if args.parallel_problems:
        command += ["--parallel-problems", str(args.parallel_problems)]
    if args.no_torch_compile:
        command += ["--no-torch-compile"]
    if settings:
        command += ["--config", str(Path(settings).resolve())]
    env = dict(os.environ, **({trace.TRACE_ENV: str(trace_path)} if trace_path else {}))
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        log, _ = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:  # what was recorded so far is still reported
        os.killpg(process.pid, signal.SIGKILL)
        log, _ = process.communicate()
        log += f"\n[kernelbench_suite] stopped after --timeout {args.timeout} s"
    wall_s = time.perf_counter() - start
    return wall_s, process.returncode, log


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(label: str, suite: Path, results_dir: Path, wall_s: float, returncode: int, log: str) -> dict:
    problems = sorted(p.stem for p in suite.glob("*.py"))
    try:
        attempts = results.load("attempts", str(results_dir))
        runs = results.load("runs", str(results_dir))
    except Exception as exc:  # noqa: BLE001 - a run that recorded nothing is reported, not raised
        print(f"{label}: no results ({exc}); exit {returncode}\n{log[-3000:]}")
        return {"label": label, "problems": len(problems), "judged": 0}
    if runs.empty:
        print(f"{label}: no run recorded; exit {returncode}\n{log[-3000:]}")
        return {"label": label, "problems": len(problems), "judged": 0}
    run_id = runs.sort_values("started_at")["run_id"].iloc[-1]
    attempts = attempts[attempts["run_id"] == run_id]
    finished = runs[(runs["run_id"] == run_id) & runs["summary"].notna()]
    summary = json.loads(finished["summary"].iloc[-1]) if len(finished) else {}
    outcomes = Counter(attempts["outcome"])
    correct = attempts[attempts["outcome"] == "correct"]
    speedups = [float(s) for s in correct["speedup_eager"].dropna()]
    print(f"\n== {label}: {suite.name}, {len(problems)} problems, exit {returncode}, wall {wall_s:.0f} s")
    print(f"judged {attempts['problem_id'].nunique()}  outcomes {dict(outcomes)}")
    for _, row in attempts[attempts["outcome"] != "correct"].iterrows():
        excerpt = str(row.get("error_excerpt") or "").strip().splitlines()
        print(f"  {row['problem_id']}: {row['outcome']} / {row['error_class']}: {(excerpt or [''])[-1][:160]}")
    without_row = sorted(set(problems) - set(attempts["problem_id"]))
    if without_row:
        print(f"  no row: {', '.join(without_row)}")
        for key in ("broken_problems", "failed_problems"):
            if summary.get(key):
                print(f"    {key}: {summary[key]}")
    line = {"label": label, "problems": len(problems), "judged": int(attempts["problem_id"].nunique())}
    if speedups:
        within = sum(abs(s - 1) <= 0.02 for s in speedups)
        quantiles = [min(speedups), percentile(speedups, 0.05), percentile(speedups, 0.5)]
        quantiles += [percentile(speedups, 0.95), max(speedups)]
        print("identity speedup  min {:.3f}  p5 {:.3f}  median {:.3f}  p95 {:.3f}  max {:.3f}".format(*quantiles))
        print(f"within +-2%: {within}/{len(speedups)}")
        off = correct[(correct["speedup_eager"] - 1).abs() > 0.02]
        for _, row in off.iterrows():
            print(
                f"  off: {row['problem_id']} {row['speedup_eager']:.3f} (eager {row['eager_ms']:.4g} ms, "
                f"candidate {row['runtime_ms']:.4g} ms, {row['timing_source']})"
            )
        line.update(median=quantiles[2], within=within, correct=len(speedups))
    per_hour = len(attempts) / wall_s * 3600 if wall_s else 0.0
    print(f"candidates fully judged per GPU-hour: {per_hour:.0f}")
    line.update(wall_s=wall_s, per_hour=per_hour)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernelbench", default=str(PROJECT.parent / "shared" / "kernelbench"))
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--slice", default=":", help="start:stop over each level's problems, by number")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--parallel-problems", type=int, default=None)
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument(
        "--config",
        action="append",
        default=None,
        help="a run settings file for kforge run (e.g. worker_pool: 8); given more than once, each level runs "
        "under each, side by side, each with a cache of its own",
    )
    parser.add_argument("--timeout", type=float, default=None, help="stop each run after this many seconds")
    parser.add_argument("--rerun", action="store_true", help="run again over the same cache, side by side")
    parser.add_argument("--out", default=None, help="keep results and cache here (default: a temporary folder)")
    parser.add_argument(
        "--trace", action="store_true", help="trace each run (tasks/trace.py) and print where its wall time went"
    )
    args = parser.parse_args()
    start, _, stop = args.slice.partition(":")
    selection = slice(int(start) if start else None, int(stop) if stop else None)
    where = Path(args.out or tempfile.mkdtemp(prefix="kforge-kernelbench-"))
    where.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    lines = []
    for level in [int(x) for x in args.levels.split(",")]:
        suite = make_suite(Path(args.kernelbench), level, selection, where / "suites" / f"{level}-{args.slice}")
        for settings in args.config or [None]:
            tag = Path(settings).stem if settings else "defaults"
            cache = where / f"cache-{tag}"
            for label in ["first run", "rerun"] if args.rerun else ["first run"]:
                name = f"{level}-{tag}-{label.replace(' ', '_')}"
                results_dir = where / "results" / name
                trace_path = where / f"trace-{name}.jsonl" if args.trace else None
                wall_s, returncode, log = run_cli(suite, args, results_dir, cache, trace_path, settings)
                (where / f"log-{name}.txt").write_text(log)
                line = report(f"{label} ({tag})", suite, results_dir, wall_s, returncode, log)
                lines.append({"level": level, "settings": tag, **line, "label": label})
                if trace_path and trace_path.exists():
                    print(f"where the wall time went ({trace_path}):\n{trace.summary(trace.read(trace_path), wall_s)}")
    print("\nlevel  settings      run        problems judged correct  within+-2%  median   wall s  per GPU-hour")
    for line in lines:
        print(
            f"{line['level']:5d}  {line['settings'][:12]:12s}  {line['label']:9s}  {line['problems']:8d} "
            f"{line['judged']:6d} {line.get('correct', 0):7d}  {line.get('within', 0):10d}  "
            f"{line.get('median', float('nan')):6.3f} {line.get('wall_s', 0):8.0f}  {line.get('per_hour', 0):12.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
