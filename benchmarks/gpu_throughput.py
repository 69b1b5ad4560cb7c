"""Candidates fully evaluated (compile + verify + time) per GPU-hour, three (four) ways side by side in one run.

    python benchmarks/gpu_throughput.py [--candidates N] [--parallel P] [--flow [--flow-rounds R]]
    python benchmarks/gpu_throughput.py --backend cpu --flow --parallel 2 --flow-rounds 2   # quick check, no GPU

1. fresh: one new worker process per stage (python -m tasks.harness.worker), one candidate after
   another: what every stage pays without a pool.
2. pool: workers started ahead of need (torch imported, CUDA context made; `worker_pool`), still
   one process per stage, one candidate after another.
3. pool + parallel: P candidates at a time from a thread pool; compiles run side by side on the
   CPU cores while verify and time hold the GPU slot one at a time (`tasks.slots._gpu_slot`).

4. run_suite flow (--flow): `kforge run` itself, through `flows.suite.run_suite` with
   `parallel_problems` P, the offline reference agent and iterations 0 (one candidate per problem,
   plus the problem's eager baseline, timed once per problem as in any run). The level-1 smoke
   problems whose reference kernel is the agent's only proposal (no flawed drafts), copied into R
   suite folders (rounds), each copy's source made distinct by a comment so no stage is a cache hit;
   the rounds run one after another, the kernel cache emptied before each so every candidate is
   really compiled. Counted: candidates with outcome `correct` (compiled, verified and timed).
   The worker pool is RunConfig's default unless --flow-worker-pool is given. On `--backend cpu`
   only this mode runs (the others need a GPU).

Candidates of 1-3 are the level-1 CUDA reference kernels (relu, gelu, softmax, layernorm, sum over a
dim, at the problems' "gpu" sizes) made distinct by a comment in their CUDA source, so every
candidate is really compiled by nvcc (an empty kernel cache per configuration). The run's real
protocol is used: RunConfig defaults (3 correctness trials, warm-up, 10 to 100 timed runs within
1 s, L2 flush between runs).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
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
from tasks.judge import evaluate_in_worker  # noqa: E402

PROBLEMS = ("1_relu", "1_gelu", "1_softmax", "1_layernorm", "1_sum_dim")
SMOKE = ROOT / "data" / "problems" / "smoke"


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


def flow_problem_ids(backend: str) -> list[str]:
    """Level-1 smoke problems for which the reference agent proposes exactly one (working) kernel."""
    from tasks.generate import KERNELS_REF, reference_proposals

    return [
        path.stem
        for path in sorted(SMOKE.glob("1_*.py"))
        if len(reference_proposals(KERNELS_REF, backend, path.stem)) == 1
    ]


def stage_medians(tag: str) -> dict[str, float]:
    """Median wall seconds of the compile, verify and time task runs under `tag` (waits included)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterTags
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            task_run_filter=TaskRunFilter(tags=TaskRunFilterTags(all_=[tag])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            limit=200,
        )
    seconds: dict[str, list[float]] = {}
    for run in task_runs:
        if run.start_time and run.end_time:
            stage = run.name.rsplit("-", 1)[0]
            seconds.setdefault(stage, []).append((run.end_time - run.start_time).total_seconds())
    return {
        stage: statistics.median(values) for stage, values in seconds.items() if stage in ("compile", "verify", "time")
    }


def measure_flow(
    backend: str, candidates: int, rounds: int | None, parallel: int, pool: int | None, torch_compile: bool
) -> dict[str, object]:
    """Candidates per hour through run_suite: `rounds` suites of distinct level-1 problems, one after another
    (default: enough rounds for about 2 x `candidates`)."""
    work = Path(tempfile.mkdtemp(prefix="kforge-bench-flow-"))
    # Before Prefect is imported (it reads its settings then): a fresh ephemeral server and database
    # unless PREFECT_API_URL names a server, as `kforge run` does.
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect-home"))
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(work / "prefect-results"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    from prefect import tags
    from prefect.client.orchestration import get_client

    from flows.suite import run_suite
    from kforge import results

    problem_ids = flow_problem_ids(backend)
    if not problem_ids:
        sys.exit(f"no level-1 problem in {SMOKE} has a single reference kernel in kernels_ref/{backend}/")
    rounds = rounds or max(2, math.ceil(2 * candidates / len(problem_ids)))
    config = RunConfig(
        backend=backend,
        iterations=0,
        agent="reference",
        cache_dir=str(work / "cache"),
        results_dir=str(work / "results"),
        parallel_problems=parallel,
        worker_pool=pool,
        torch_compile_baseline=torch_compile,
        base_seed=11,
    )
    print(
        f"\nrun_suite flow: {rounds} round(s) of {len(problem_ids)} problems ({', '.join(problem_ids)}), "
        f"backend {backend}, parallel_problems {config.effective_parallel_problems()}, "
        f"worker_pool {config.effective_worker_pool()}, torch.compile baseline {'on' if torch_compile else 'off'}",
        flush=True,
    )
    with get_client(sync_client=True) as client:
        client.hello()  # start the ephemeral server now, outside the timed rounds
    tag = f"gpu-throughput-{work.name}"
    round_s, failed_rounds, medians = [], [], []
    for round_index in range(rounds):
        suite = work / f"round-{round_index}"
        suite.mkdir()
        for problem_id in problem_ids:
            source = (SMOKE / f"{problem_id}.py").read_text()
            (suite / f"{problem_id}.py").write_text(f"{source}\n# gpu_throughput.py --flow, round {round_index}\n")
        shutil.rmtree(work / "cache" / "kernels", ignore_errors=True)  # every candidate compiled anew
        start = time.perf_counter()
        with tags(f"{tag}-{round_index}"):
            state = run_suite(config.model_copy(update={"suite": str(suite)}), return_state=True)
        round_s.append(time.perf_counter() - start)
        if not state.is_completed():
            failed_rounds.append(f"round {round_index}: {state.message}")
        medians.append(stage_medians(f"{tag}-{round_index}"))
        print(f"  round {round_index}: {round_s[-1]:.1f} s, {state.name}", flush=True)
    attempts = results.load("attempts", config.results_dir)
    correct = attempts[attempts["outcome"] == "correct"]
    correct_per_round = [int((correct["suite"] == f"round-{i}").sum()) for i in range(rounds)]
    failures = [
        f"{row.problem_id}: {row.outcome} {row.error_class}"
        for row in attempts.itertuples()
        if row.outcome != "correct"
    ]
    steady = sum(correct_per_round[1:]) / sum(round_s[1:]) * 3600 if rounds > 1 and sum(round_s[1:]) > 0 else None
    return {
        "name": "run_suite flow",
        "candidates": len(correct),
        "parallel": config.effective_parallel_problems(),
        "pool": config.effective_worker_pool(),
        "elapsed_s": sum(round_s),
        "per_hour": len(correct) / sum(round_s) * 3600,
        "steady_per_hour": steady,
        "failures": failures + failed_rounds,
        "stage_median_s": {
            stage: statistics.median(m[stage] for m in medians if stage in m)
            for stage in ("compile", "verify", "time")
            if any(stage in m for m in medians)
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=8, help="candidates (1-3) or problems (--flow) in flight")
    parser.add_argument("--backend", choices=("cuda", "triton", "cpu"), default="cuda", help="of --flow; 1-3 are cuda")
    parser.add_argument("--flow", action="store_true", help="also measure run_suite itself (mode 4)")
    parser.add_argument("--flow-rounds", type=int, help="suites run one after another (default: about 2x --candidates)")
    parser.add_argument("--flow-worker-pool", type=int, help="worker_pool of the flow (default: RunConfig's)")
    parser.add_argument("--torch-compile-baseline", action="store_true", help="flow: also time torch.compile")
    args = parser.parse_args()
    direct = args.backend == "cuda"  # modes 1-3 evaluate CUDA candidates directly
    if not direct and not args.flow:
        sys.exit(f"--backend {args.backend} measures only the run_suite flow: add --flow")
    import torch

    if args.backend != "cpu" and not torch.cuda.is_available():
        sys.exit(
            f"--backend {args.backend} needs an NVIDIA GPU (torch.cuda.is_available() is False); try --backend cpu"
        )
    gpu = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
        if shutil.which("nvidia-smi")
        else "none"
    )
    print(f"GPU: {gpu or 'none'}; torch {torch.__version__}; CPU cores: {len(os.sched_getaffinity(0))}", flush=True)
    rows = []
    if direct:
        rows += [
            measure("fresh", max(5, args.candidates // 2), parallel=1, pool=0),
            measure("pool", args.candidates, parallel=1, pool=2),
            measure("pool+parallel", args.candidates * 2, parallel=args.parallel, pool=args.parallel + 2),
        ]
    if args.flow:
        flow_args = (args.candidates, args.flow_rounds, args.parallel, args.flow_worker_pool)
        rows.append(measure_flow(args.backend, *flow_args, args.torch_compile_baseline))
    per = "per GPU-hour" if args.backend != "cpu" else "per hour (cpu)"
    print(
        f"\n{'configuration':<16}{'candidates':>11}{'parallel':>9}{'pool':>5}{'elapsed s':>11}{per:>16}"
        f"{'compile s':>11}{'verify s':>10}{'time s':>8}  failures"
    )
    for row in rows:
        stage = row["stage_median_s"]
        print(
            f"{row['name']:<16}{row['candidates']:>11}{row['parallel']:>9}{row['pool']:>5}{row['elapsed_s']:>11.1f}"
            f"{row['per_hour']:>16.0f}{stage.get('compile', 0):>11.2f}{stage.get('verify', 0):>10.2f}"
            f"{stage.get('time', 0):>8.2f}  {row['failures'] or 'none'}"
        )
    print("\nstage times are medians of wall time per stage, including any wait for the GPU slot (cpu: the cores)")
    if direct:
        print(
            f"pool / fresh: {rows[1]['per_hour'] / rows[0]['per_hour']:.2f}x; "
            f"pool+parallel / fresh: {rows[2]['per_hour'] / rows[0]['per_hour']:.2f}x"
        )
    if args.flow:
        flow_row = rows[-1]
        steady = flow_row["steady_per_hour"]
        print(
            f"run_suite flow: {flow_row['per_hour']:.0f} candidates {per} over all rounds (the first also pays "
            f"one-time start-up: worker pool, compiler checks), {f'{steady:.0f}' if steady else '-'} over rounds 2+; "
            "each candidate here also pays its problem's baseline stage, which also makes the reference's "
            "outputs (iterations 0); "
            "target >= 2000 per GPU-hour"
        )


if __name__ == "__main__":
    main()
