"""Profile stage: where a correct candidate, or the problem's reference, spends the time of one call.

Profiles are advisory. They guide the agents (the performance analysis agent and the knowledge
base's state extractor) and never decide a verdict or a time: the worker makes its inputs itself
from the problem module's get_inputs() under a seed (not from the orchestrator's trusted inputs,
tasks/trusted.py), warms the model up and profiles ONE call (tasks/harness/profiling.py). A
profiler that is missing or refused is one warning line and the torch.profiler fallback, never a
failed attempt; a candidate that fails in the profiled call gives the usual failure result.

On NVIDIA GPUs with `ncu` on PATH, Nsight Compute runs the worker (tasks/ncu.py) and its kernel
metrics are the profile; elsewhere torch.profiler's per-op and per-kernel times inside the worker.
`profile_rows` turns either into rows of the `profiles` results table (kforge/results.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import task

from kforge.config import RunConfig
from kforge.results import append_rows
from tasks import drive, ncu
from tasks.caching import content_key, retry_on_infrastructure, source_hash
from tasks.harness.protocol import WorkerRequest
from tasks.isolate import Limits, run_worker
from tasks.pool import worker_pool
from tasks.problems import Problem
from tasks.trusted import new_seed

MAX_ROWS = 200  # per section (cpu_ops, cuda_kernels), by self time
NCU_LAUNCHES = 20  # kernels ncu profiles in the call: each is replayed once per pass of its sections
NCU_SLOWDOWN = 10  # ncu's replays make a worker's CPU time this many times longer, at most
# Why ncu gave nothing in this process, by ncu path: a timeout or refusal is not retried on every
# problem (a 9-problem smoke run on an H200 once waited on a candidate's ncu worker for minutes).
_ncu_given_up: dict[str, str] = {}


def forget_ncu_failures() -> None:
    """A new run tries ncu again (the host's permissions or the candidates may differ now)."""
    _ncu_given_up.clear()


TORCH_METRICS = (("self_time_us", "us"), ("total_time_us", "us"), ("calls", ""))
_log = logging.getLogger(__name__)


def profile_in_worker(
    problem_source: str, candidate_source: str | None, config: RunConfig, model: str = "candidate"
) -> dict[str, Any]:
    """Profile one call of the candidate's ModelNew (`model` "candidate") or of the reference Model
    ("reference") in an isolated worker. Returns {"outcome": "correct", "tool", "tool_version",
    "rows", "truncated", ...} with "warning" when ncu was wanted but gave nothing, or the failure
    (outcome, error_class, error_excerpt) of a model that could not be built or run."""
    request = replace(
        drive._request("profile", problem_source, candidate_source, config, model),
        input_seed=new_seed(),
        max_rows=MAX_ROWS,
    )
    limits = drive._limits("compile", config, problem_source)  # its import and construction as the compile stage's
    ncu_path = ncu.find_ncu(config.backend)
    warning = None
    if ncu_path is not None and ncu_path in _ncu_given_up:
        warning = f"{_ncu_given_up[ncu_path]} (earlier in this run)"
    elif ncu_path is not None:
        profiled, warning = _under_ncu(ncu_path, request, limits, config)
        if profiled is not None:
            return profiled
        if "timeout" in warning or warning == ncu.REFUSED:
            _ncu_given_up[ncu_path] = warning
        _log.warning("kforge: %s; profiling with torch.profiler instead", warning)
    profiled = run_worker(request, limits, _kernel_cache(config), config.threads, _pool(config))
    return {**profiled, "warning": warning} if warning else profiled


def _under_ncu(
    ncu_path: str, request: WorkerRequest, limits: Limits, config: RunConfig
) -> tuple[dict[str, Any] | None, str | None]:
    """(the profile, None) from a worker run under ncu, or (None, why not) in one line."""
    slow = replace(limits, wall_s=config.profile_timeout_s, cpu_s=limits.cpu_s * NCU_SLOWDOWN)
    report_name = "ncu-report.csv"  # in the worker's control directory, read back by run_worker
    wrapper = ncu.command(ncu_path, Path("{control}") / report_name, NCU_LAUNCHES)
    result = run_worker(
        replace(request, profiler="ncu"),
        slow,
        _kernel_cache(config),
        config.threads,
        wrapper=wrapper,
        collect=(report_name,),
    )
    report = (result.pop("collected", None) or {}).get(report_name, "")
    if reason := ncu.refusal(report):
        return None, reason
    if result["outcome"] != "correct":  # ncu's doing or the candidate's: torch.profiler tells which
        said = [line.strip() for line in report.splitlines() if line.startswith("==")]
        last = f"; ncu's last line: {said[-1][:200]}" if said else "; ncu wrote nothing"
        return None, f"the worker under ncu ended with {result['outcome']} ({result.get('error_class')}){last}"
    rows, truncated = ncu.parse_details(report, NCU_LAUNCHES)
    if not rows:
        return None, ncu.NO_REPORT
    launches = len({row["instance"] for row in rows})
    profiled = {"tool": "ncu", "tool_version": ncu.version(ncu_path), "rows": rows}
    return {**result, **profiled, "truncated": truncated or launches >= NCU_LAUNCHES}, None


def _kernel_cache(config: RunConfig) -> Path:
    return Path(config.cache_dir) / "kernels"


def _pool(config: RunConfig) -> Any:
    return worker_pool(config.effective_worker_pool())


def profile_rows(
    profiled: dict[str, Any],
    run_id: str,
    problem_id: str,
    attempt_id: str | None,
    created_at: datetime | None = None,
) -> list[dict[str, Any]]:
    """Rows of the `profiles` table from `profiled` (profile_in_worker's result; none for a
    failure). torch.profiler: one row per (op or kernel, metric), metrics self_time_us,
    total_time_us and calls, `instance` the input shapes. ncu: one row per (launch, metric).
    `attempt_id` None: a profile of the reference."""
    if profiled.get("outcome") != "correct":
        return []
    common = {
        "attempt_id": attempt_id,
        "run_id": run_id,
        "problem_id": problem_id,
        "tool": profiled["tool"],
        "tool_version": profiled.get("tool_version") or "",
        "created_at": created_at or datetime.now(timezone.utc),
    }
    if profiled["tool"] == "ncu":
        return [{**common, **row} for row in profiled["rows"]]
    return [{**common, **metric_row} for row in profiled["rows"] for metric_row in _torch_metric_rows(row)]


def _torch_metric_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    where = {"kernel": row["name"], "instance": row["input_shapes"], "section": row["section"]}
    return [{**where, "metric": metric, "value": float(row[metric]), "unit": unit} for metric, unit in TORCH_METRICS]


def _cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    config: RunConfig = parameters["config"]
    problem: Problem = parameters["problem"]
    return content_key(
        "profile",
        problem.source_hash,
        source_hash(parameters["candidate_source"] or ""),
        parameters.get("model", "candidate"),
        config.backend,
        config.effective_size_preset(),
        socket.gethostname(),  # times are this host's
        ncu.find_ncu(config.backend) is not None,
    )


@task(
    name="profile",
    task_run_name="profile {problem.problem_id}",
    cache_key_fn=_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_on_infrastructure,
)
def profile_task(
    problem: Problem, candidate_source: str | None, config: RunConfig, model: str = "candidate"
) -> dict[str, Any]:
    return profile_in_worker(problem.source, candidate_source, config, model)


def _record_key(_context: Any, parameters: dict[str, Any]) -> str:
    # One write per profile: a replayed flow run (profile_task answered from its cache) writes nothing twice.
    profiled = parameters["profiled"]
    measured = json.dumps([profiled.get("outcome"), profiled.get("tool"), profiled.get("rows")], default=str)
    subject = parameters["attempt_id"] or f"reference-{parameters['problem_id']}"
    return f"record-profile-{parameters['run_id']}-{subject}-{hashlib.sha256(measured.encode()).hexdigest()[:16]}"


@task(
    name="record-profile",
    task_run_name="record-profile {problem_id}",
    cache_key_fn=_record_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=3,
)
def record_profile_task(
    profiled: dict[str, Any], run_id: str, problem_id: str, attempt_id: str | None, results_dir: str
) -> int:
    """Append `profiled`'s rows to the `profiles` table; the number of rows written (0 for a failure)."""
    rows = profile_rows(profiled, run_id, problem_id, attempt_id)
    if rows:
        append_rows(results_dir, "profiles", rows, run_id=run_id)
    return len(rows)
