"""What the integrity checks cost per candidate, against the candidate's whole evaluation.

    python benchmarks/integrity_overhead.py [--backend cpu|cuda|triton] [--problems relu,matmul]
        [--repeats N] [--samples S] [--candidates-per-problem K] [--size-preset gpu]

For each smoke problem (data/problems/smoke/*.py), with its reference kernel from
kernels_ref/<backend>/ as the candidate, at the backend's size preset (RunConfig's: 'gpu' on cuda
and triton, the files' own sizes on cpu; --size-preset overrides it):

1. Evaluation, end to end, as the pipeline runs one candidate: `precheck` in this process, then
   `evaluate_in_worker` for compile, verify and time, one after another (RunConfig defaults: 3
   correctness trials, the default timing protocol, the backend's default worker pool, all cores;
   base_seed 7, no torch.compile baseline, which is per problem, not per candidate). Wall time of
   each call, worker start-up and the parent's judging included. Before the measured candidates,
   per problem: one compile of the kernel into an empty cache (g++/nvcc really run; printed as
   "first compile"; on GPU backends the first problem's also starts the worker pool) and the
   problem's baseline worker, as the flow runs it before its first candidate ("baseline s"), which
   also makes the reference's outputs for the judge. The N measured candidates
   (--repeats, default 2) are the kernel with a distinct trailing comment, so the candidate's source
   is new but its kernel code is not: their compiles find the kernel in the cache (a warm kernel
   cache, which makes the evaluation shorter and the checks' share larger than for a new kernel).
   Their median is the candidate's evaluation; the reference outputs' cost divided by K
   (--candidates-per-problem, default 2 = iterations + 1 at RunConfig's default of 1 iteration) is
   added to it.
2. Each check: `save`, `judge` and `reference` as measured inside that evaluation (the worker's
   and the parent's own clocks); the others timed in this process (the candidates are trusted
   reference kernels) on the same problem, inputs, seeds and kernel, with the harness's own
   functions: one untimed call each, then S rounds (--samples, default 11) that call every check
   once, the device synchronized around each call; the median per check, multiplied by how often
   one candidate's evaluation runs it:
     precheck     tasks.precheck.precheck, once (the problem's op list cached, as in a run)
     record_ops   forward under record_ops minus the plain forward, once
     poison       forward under poisoned_allocations minus the plain forward, once per trial
     inputs       clone of the inputs + _check_inputs_unchanged, once per trial
     guard        guard.snapshot 3 times and guard.patched 4 + trials times (compile, verify, time)
     small        output type, aliasing and library-call checks, once per trial and once in time
     save         the worker's handover of every trial's output and the last timed one
                  (`handover_s`: IPC export of a device copy on GPU backends, a file on cpu)
     judge        the parent's judge_verify + judge_time (`judge_s`: taking the outputs, comparing)
     refill       timing's input refill before each run (fresh inputs per run), warm-up + timed runs
     reference    the reference's outputs: made and handed over in the baseline worker
                  (`expected_s`) and taken by the parent (`expected_take_s`), / K
   A difference below zero is noise and counts as zero in the sum. These are steady-state costs:
   a fresh worker also pays each check's one-time first-call costs, which are not included.

Not counted as checks (they are in the evaluation time): process isolation itself (a worker per
stage, its start-up, limits, network namespace), the seeds' input generation, the extra timing
input sets, the timing protocol's flush and side-stream event.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kforge.config import RunConfig  # noqa: E402
from tasks.harness import guard, modules  # noqa: E402
from tasks.harness.dispatch import record_ops  # noqa: E402
from tasks.harness.timing import _refill  # noqa: E402
from tasks.harness.worker import (  # noqa: E402
    _aliases_an_input,
    _check_inputs_unchanged,
    _check_library_calls,
    _check_output_tensors,
    poisoned_allocations,
)
from tasks.isolate import scratch_root  # noqa: E402
from tasks.judge import TIMING_INPUT_SETS, evaluate_in_worker  # noqa: E402
from tasks.precheck import precheck  # noqa: E402

SMOKE = ROOT / "data" / "problems" / "smoke"
TARGET = 0.10
COMPONENTS = ("precheck", "record_ops", "poison", "inputs", "guard", "small", "save", "judge", "refill", "reference")


def machine_facts(backend: str) -> list[tuple[str, str]]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        "unknown",
    )
    facts = [
        ("date", time.strftime("%Y-%m-%d %H:%M %Z")),
        ("cpus", f"{os.cpu_count()} (usable: {len(os.sched_getaffinity(0))}), load {os.getloadavg()[0]:.2f}"),
        ("cpu model", model),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("backend", backend),
    ]
    if backend != "cpu" and torch.cuda.is_available():
        facts.append(("gpu", torch.cuda.get_device_name()))
    return facts


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def clock(fn: Callable[[], Any], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def medians(probes: dict[str, Callable[[], Any]], samples: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each probe over `samples` rounds, after one untimed call each. A round calls
    every probe once, so a burst of load from other processes spreads over all of them."""
    for probe in probes.values():
        probe()
    times: dict[str, list[float]] = {name: [] for name in probes}
    for _ in range(samples):
        for name, probe in probes.items():
            times[name].append(clock(probe, device))
    return {name: statistics.median(values) for name, values in times.items()}


def evaluate_candidate(problem_source: str, candidate_source: str, config: RunConfig) -> dict[str, float]:
    """Wall seconds of each stage of one candidate, as tasks/compile.py, verify.py and measure.py run
    them, and the handover and judge seconds the worker and the parent measured inside them."""
    start = time.perf_counter()
    rejection = precheck(candidate_source, problem_source, config.allow_library_calls)
    stages = {"precheck": time.perf_counter() - start, "save": 0.0, "judge": 0.0}
    if rejection is not None:
        raise RuntimeError(f"precheck: {rejection}")
    for mode in ("compile", "verify", "time"):
        start = time.perf_counter()
        result = evaluate_in_worker(mode, problem_source, candidate_source, config)
        stages[mode] = time.perf_counter() - start
        if result["outcome"] != "correct":
            raise RuntimeError(
                f"{mode}: {result['outcome']} {result.get('error_class')}: {result.get('error_excerpt')}"
            )
        stages["save"] += result.get("handover_s", 0.0)
        stages["judge"] += result.get("judge_s", 0.0)
    stages["timed_runs"] = result["timed_runs"]
    return stages


def end_to_end(problem_source: str, kernel_source: str, config: RunConfig, repeats: int) -> dict[str, Any]:
    """First (cold-cache) compile and the problem's baseline worker (which also makes the reference's
    outputs, as in a run), then `repeats` distinct candidates."""
    start = time.perf_counter()
    compiled = evaluate_in_worker("compile", problem_source, kernel_source, config)
    first_compile_s = time.perf_counter() - start
    if compiled["outcome"] != "correct":
        raise RuntimeError(f"first compile: {compiled['outcome']}: {compiled.get('error_excerpt')}")
    start = time.perf_counter()
    baseline = evaluate_in_worker("baseline", problem_source, None, config)
    baseline_s = time.perf_counter() - start
    if baseline["outcome"] != "correct" or "expected_s" not in baseline:
        raise RuntimeError(f"baseline: {baseline['outcome']} {baseline.get('error_excerpt')} (or no reference outputs)")
    runs = [
        evaluate_candidate(
            problem_source, f"{kernel_source}\n# integrity_overhead candidate {i} {time.time()}\n", config
        )
        for i in range(repeats)
    ]
    stages = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    totals = [run["precheck"] + run["compile"] + run["verify"] + run["time"] for run in runs]
    return {
        **stages,
        "candidate_s": statistics.median(totals),
        "baseline_s": baseline_s,
        "reference_s": baseline["expected_s"] + baseline["expected_take_s"],
        "first_compile_s": first_compile_s,
    }


def check_costs(
    problem_source: str, kernel_source: str, config: RunConfig, timed_runs: int, samples: int, workdir: Path
) -> tuple[dict[str, float], str]:
    """Per candidate seconds of each in-process check (COMPONENTS less save, judge and reference,
    which are measured inside the evaluation) and the input shapes."""
    device = modules.device_for(config.backend)
    problem = modules.load_module(problem_source, "problem", workdir, config.effective_size_preset())
    candidate = modules.load_module(kernel_source, "candidate", workdir)
    init_seed = config.seeds("init", 1)[0]
    model_new = modules.build_model(problem, candidate.ModelNew, init_seed, device)
    reference = modules.build_model(problem, problem.Model, init_seed, device)
    trials = config.correctness_trials
    verify_inputs = [modules.make_inputs(problem, s, device) for s in config.seeds("verify", trials)]
    time_inputs = [modules.make_inputs(problem, s, device) for s in config.seeds("time", TIMING_INPUT_SETS)]
    shapes = ",".join("x".join(map(str, v.shape)) for v in verify_inputs[0] if isinstance(v, torch.Tensor))
    request = {"allow_library_calls": config.allow_library_calls}

    with torch.no_grad():
        reference_ops = record_ops(reference, *verify_inputs[0])[1]
        candidate_ops = record_ops(model_new, *verify_inputs[0])[1]
        outputs = [model_new(*inputs) for inputs in verify_inputs]
        last_output = model_new(*time_inputs[-1])
        bindings = guard.snapshot()
        live = [v.clone() if isinstance(v, torch.Tensor) else v for v in time_inputs[0]]

        def poisoned() -> Any:
            with poisoned_allocations():
                return model_new(*verify_inputs[0])

        def inputs_check(trial: int) -> Callable[[], None]:
            def clone_and_compare() -> None:
                before = [v.clone() if isinstance(v, torch.Tensor) else v for v in verify_inputs[trial]]
                _check_inputs_unchanged(before, verify_inputs[trial])

            return clone_and_compare

        def small_checks() -> None:
            for inputs, output in zip(verify_inputs, outputs):
                _check_library_calls(request, reference_ops, candidate_ops)
                _check_output_tensors(output, device)
                if _aliases_an_input(output, inputs):
                    raise RuntimeError("the reference kernel returns an input")
            _check_output_tensors(last_output, device)

        probes = {
            "forward": lambda: model_new(*verify_inputs[0]),
            "record_ops": lambda: record_ops(model_new, *verify_inputs[0]),
            "poisoned": poisoned,
            "precheck": lambda: precheck(kernel_source, problem_source, config.allow_library_calls),
            **{f"inputs {trial}": inputs_check(trial) for trial in range(trials)},
            "small": small_checks,
            "snapshot": guard.snapshot,
            "patched": lambda: guard.patched(bindings),
            "refill": lambda: _refill(live, time_inputs[1]),
        }
        median = medians(probes, samples, device)
    costs = {
        "precheck": median["precheck"],
        "record_ops": median["record_ops"] - median["forward"],
        "poison": (median["poisoned"] - median["forward"]) * trials,
        "inputs": sum(median[f"inputs {trial}"] for trial in range(trials)),
        "guard": 3 * median["snapshot"] + (4 + trials) * median["patched"],
        "small": median["small"],
        "refill": median["refill"] * (config.warmup_runs + timed_runs),
    }
    return {name: max(0.0, value) for name, value in costs.items()}, shapes


def table(header: list[str], rows: list[list[str]], left: int = 1) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cpu", "cuda", "triton"], default="cpu")
    parser.add_argument("--problems", default="", help="comma-separated parts of problem names (default: all)")
    parser.add_argument("--size-preset", help="problem SIZE_PRESETS entry (default: RunConfig's for the backend)")
    parser.add_argument("--repeats", type=int, default=2, help="measured candidates per problem")
    parser.add_argument("--samples", type=int, default=11, help="timed rounds of the in-process checks")
    parser.add_argument("--candidates-per-problem", type=int, default=2, help="K, to amortize the reference worker")
    args = parser.parse_args()
    wanted = [w for w in args.problems.split(",") if w]
    problems = [p for p in sorted(SMOKE.glob("*.py")) if not wanted or any(w in p.stem for w in wanted)]
    k = args.candidates_per_problem
    for key, value in machine_facts(args.backend):
        print(f"{key:10} {value}")
    print()

    started = time.perf_counter()
    rows, component_rows, shares, shares_without_reference = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="kforge-bench-integrity-", dir=scratch_root()) as scratch:
        config = RunConfig(
            backend=args.backend,
            size_preset=args.size_preset,
            cache_dir=scratch,
            torch_compile_baseline=False,
            base_seed=7,
        )
        os.environ["KFORGE_KERNEL_CACHE"] = str(Path(scratch) / "kernels")  # this process loads what workers built
        for path in problems:
            problem_source = path.read_text()
            kernel_source = (ROOT / "kernels_ref" / args.backend / path.name).read_text()
            print(f"{path.stem}: evaluating ...", flush=True)
            try:
                evaluation = end_to_end(problem_source, kernel_source, config, args.repeats)
                if config.backend == "cpu":
                    # the spare worker started after the last stage imports torch for 1.5-2 s on 2
                    # cores; probes timed beside it measure the contention, not the checks
                    time.sleep(3)
                with tempfile.TemporaryDirectory(dir=scratch) as workdir:
                    timed_runs = int(evaluation["timed_runs"])
                    costs, shapes = check_costs(
                        problem_source, kernel_source, config, timed_runs, args.samples, Path(workdir)
                    )
            except Exception as exc:  # noqa: BLE001 - one broken problem should not hide the others
                print(f"{path.stem}: FAILED: {exc}", flush=True)
                rows.append([path.stem, "FAILED", *[""] * 10])
                continue
            costs["save"], costs["judge"] = evaluation["save"], evaluation["judge"]
            costs["reference"] = evaluation["reference_s"] / k
            evaluation_s = evaluation["candidate_s"] + costs["reference"]
            checks_s = sum(costs.values())
            largest = max(costs, key=costs.get)
            shares.append(checks_s / evaluation_s)
            shares_without_reference.append((checks_s - costs["reference"]) / (evaluation_s - costs["reference"]))
            rows.append(
                [
                    path.stem,
                    shapes,
                    *[f"{evaluation[s]:.2f}" for s in ("compile", "verify", "time", "baseline_s")],
                    f"{evaluation['reference_s']:.3f}",
                    f"{evaluation_s:.2f}",
                    f"{checks_s:.3f}",
                    f"{shares[-1]:.1%}",
                    f"{largest} {costs[largest]:.3f}",
                    f"{evaluation['first_compile_s']:.2f}",
                ]
            )
            component_rows.append([path.stem, *[f"{costs[c] * 1000:.1f}" for c in COMPONENTS]])
            if config.backend != "cpu":
                torch.cuda.empty_cache()

    print()
    header = ["problem", "inputs", "compile s", "verify s", "time s", "baseline s", "reference s", "evaluation s"]
    table([*header, "checks s", "checks %", "largest check, s", "first compile s"], rows, left=2)
    print()
    print(f"checks per candidate, ms (reference = the reference's outputs made and taken / {k}):")
    table(["problem", *COMPONENTS], component_rows)
    if shares:
        verdict = "under" if max(shares) < TARGET else "OVER"
        print(
            f"\nchecks % of evaluation over {len(shares)} problems: median {statistics.median(shares):.1%}, "
            f"max {max(shares):.1%} ({verdict} the {TARGET:.0%} target); without `reference`: "
            f"median {statistics.median(shares_without_reference):.1%}, max {max(shares_without_reference):.1%}"
        )
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
