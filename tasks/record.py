"""Record stage: one `attempts` row per evaluated candidate, one `runs` row at start and at end.

Rows are appended as soon as an attempt ends, so a killed run keeps everything before it. The
attempt task is cached by its attempt id: rerunning a failed flow run does not write a row twice.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from prefect import task

from kforge.config import RunConfig
from kforge.results import SCHEMA_VERSION, append_rows
from tasks.caching import source_hash, toolchain_fingerprint
from tasks.generate import GenerationReply
from tasks.gpus import gpu_of
from tasks.harness.cpu import toolchain_version
from tasks.harness.cuda import nvcc_version
from tasks.measure import baseline_figure, eager_time, speedups
from tasks.problems import Problem

PROJECT_ROOT = Path(__file__).resolve().parents[1]
EXCERPT_CHARS = 2000


def attempt_id(run_id: str, problem: Problem, iteration: int, rollout: int = 0) -> str:
    return hashlib.sha256(f"{run_id}/{problem.problem_id}/{iteration}/{rollout}".encode()).hexdigest()[:16]


def final_stage(stage_results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The result that decides the attempt's outcome: the first stage that did not pass, else the last."""
    for result in stage_results.values():
        if result.get("outcome") != "correct":
            return result
    return list(stage_results.values())[-1]


def attempt_row(
    run_id: str,
    problem: Problem,
    config: RunConfig,
    iteration: int,
    reply: GenerationReply,
    stage_results: dict[str, dict[str, Any]],
    baseline: dict[str, Any],
    parent_attempt: str | None = None,
) -> dict[str, Any]:
    """The `attempts` row for one candidate from its generation reply and stage results."""
    if reply.candidate_source is None:
        decisive = {
            "outcome": "generation_failed",
            "error_class": reply.error_class or "no_code",
            "error_excerpt": reply.error,
        }
    else:
        decisive = final_stage(stage_results)
    timing = stage_results.get("time", {}) if decisive.get("outcome") == "correct" else {}
    verify = stage_results.get("verify", {})
    excerpt = decisive.get("error_excerpt")
    return {
        "attempt_id": attempt_id(run_id, problem, iteration),
        "run_id": run_id,
        "schema_version": SCHEMA_VERSION,
        "problem_id": problem.problem_id,
        "problem_hash": problem.source_hash,
        "level": problem.level,
        "suite": problem.suite,
        "backend": config.backend,
        "device": "cpu" if config.backend == "cpu" else "cuda",
        "size_preset": config.effective_size_preset(),
        "model": reply.model,
        "agent": config.agent,
        "agent_config": json.dumps(reply.agent_config, sort_keys=True),
        "max_iterations": config.iterations,
        "reference_backend": config.reference_backend,
        "performance_agent": config.performance_agent,
        "prompt_hash": reply.prompt_hash,
        "reply_cached": reply.reply_cached,
        "iteration": iteration,
        "rollout": 0,
        "parent_attempt": parent_attempt,
        "outcome": decisive["outcome"],
        "error_class": decisive.get("error_class"),
        "error_excerpt": excerpt[-EXCERPT_CHARS:] if excerpt else None,
        "source_hash": source_hash(reply.candidate_source or ""),
        "candidate_source": reply.candidate_source,
        "compile_s": stage_results.get("compile", {}).get("compile_s"),
        "runtime_ms": timing.get("runtime_ms"),
        "runtime_p10_ms": timing.get("runtime_p10_ms"),
        "runtime_p90_ms": timing.get("runtime_p90_ms"),
        "eager_ms": eager_time(timing, baseline)[0],
        "eager_source": eager_time(timing, baseline)[1],
        "compile_ms": baseline_figure(baseline, "compile", timing.get("timing_source")),
        **speedups(timing, baseline),
        "atol": verify.get("atol"),
        "rtol": verify.get("rtol"),
        "allow_library_calls": config.allow_library_calls,
        "tokens_in": reply.tokens_in,
        "tokens_out": reply.tokens_out,
        "cost_usd": reply.cost_usd,
        "recommendation": None,
        "analysis_error": None,
        "analysis_tokens_in": 0,
        "analysis_tokens_out": 0,
        "soft_check": None,  # filled in by tasks/softcheck.py when the run asks for it
        "soft_check_reason": None,
        "soft_check_error": None,
        "soft_check_tokens_in": 0,
        "soft_check_tokens_out": 0,
        "timing_source": timing.get("timing_source"),
        "retimed_from": timing.get("retimed_from"),
        "claimed_ms": timing.get("claimed_ms"),
        "observed_ms": timing.get("observed_ms"),
        "judged_seeds": json.dumps(timing["judged_seeds"]) if timing.get("judged_seeds") else None,
        "roofline_fraction": timing.get("roofline_fraction"),
        "roofline_suspect": timing.get("roofline_suspect"),
        "isolation": _isolation(stage_results),
        "host": host_name(),
        **gpu_of(config.backend, config.gpu_index),
        "created_at": datetime.now(timezone.utc),
    }


def _isolation(stage_results: dict[str, dict[str, Any]]) -> str | None:
    """The sandbox layers of the attempt's last worker (JSON), e.g. {"pid": "ok", "user": "refused: ..."}."""
    for result in reversed(list(stage_results.values())):
        if isinstance(result.get("isolation"), dict):
            return json.dumps(result["isolation"], sort_keys=True)
    return None


def _record_key(_context: Any, parameters: dict[str, Any]) -> str:
    # The attempt and what it produced: a retried run that redoes an attempt (an endpoint that was
    # down) writes the new row, which `results.load` prefers; a replayed attempt is not written twice.
    row = parameters["row"]
    verdicts = [row.get("recommendation"), row.get("soft_check"), row.get("soft_check_error")]
    decided = json.dumps([row["outcome"], row["error_class"], row["source_hash"], *verdicts])
    return f"record-{row['attempt_id']}-{hashlib.sha256(decided.encode()).hexdigest()[:16]}"


@task(
    name="record-attempt",
    task_run_name="record-attempt {row[problem_id]} #{row[iteration]}",
    cache_key_fn=_record_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=3,
)
def record_attempt_task(row: dict[str, Any], results_dir: str) -> dict[str, Any]:
    append_rows(results_dir, "attempts", [row], run_id=row["run_id"])
    return row


def _command_output(*command: str) -> str | None:
    if not shutil.which(command[0]):
        return None
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _cuda_versions() -> dict[str, str | None]:
    """The CUDA version torch was built with (its version.py, read without importing torch) and the
    newest CUDA the driver supports (nvidia-smi's header)."""
    runtime = None
    spec = importlib.util.find_spec("torch")
    if spec and spec.origin:
        version_file = Path(spec.origin).parent / "version.py"
        found = (
            re.search(r"^cuda(?:: [^=]+)? = '([^']+)'", version_file.read_text(), re.M)
            if version_file.exists()
            else None
        )
        runtime = found.group(1) if found else None
    driver = re.search(r"CUDA Version: ([0-9.]+)", _command_output("nvidia-smi") or "")
    return {"cuda_runtime": runtime, "cuda_driver_supports": driver.group(1) if driver else None}


def host_name() -> str:
    """This host's name in the results: $KFORGE_HOST where set (two workers on one machine standing in
    for two hosts, or a name clearer than the hostname), else the hostname."""
    return os.environ.get("KFORGE_HOST") or socket.gethostname()


def host_facts() -> dict[str, Any]:
    """Host, GPU, driver and toolchain versions for the `runs` table (no torch import here)."""
    gpu = _command_output("nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem", "--format=csv,noheader")
    gpu_name, driver = gpu.splitlines()[0].split(", ")[:2] if gpu else (None, None)
    return {
        "host": host_name(),
        "device": "cuda" if gpu else "cpu",
        "gpu_name": gpu_name,
        "driver": driver,
        "toolchain": json.dumps(
            {
                "gxx": toolchain_version(),
                "nvcc": nvcc_version(),
                "gpu_clocks_at_start": gpu.splitlines()[0] if gpu else None,
                **(_cuda_versions() if gpu else {"cuda_runtime": None, "cuda_driver_supports": None}),
                "fingerprint": toolchain_fingerprint(),
            }
        ),
        "torch_version": metadata.version("torch"),
        "python_version": platform.python_version(),
        "git_sha": git_sha(),
    }


def git_sha() -> str | None:
    """The checkout's commit, with "-dirty" where tracked files differ from it (a run of uncommitted code
    must not pass for that commit's); None outside a git checkout."""
    sha = _command_output("git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD")
    if sha is None:
        return None
    changed = _command_output("git", "-C", str(PROJECT_ROOT), "status", "--porcelain", "--untracked-files=no")
    return f"{sha}-dirty" if changed else sha


def run_row(
    run_id: str,
    config: RunConfig,
    status: str,
    started_at: datetime,
    facts: dict[str, Any],
    summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "config": config.model_dump_json(),
        **facts,
        "started_at": started_at,
        "finished_at": datetime.now(timezone.utc) if status != "running" else None,
        "summary": json.dumps(summary) if summary is not None else None,
    }


@task(name="record-run", task_run_name="record-run {row[status]}", retries=2, retry_delay_seconds=3)
def record_run_task(row: dict[str, Any], results_dir: str) -> None:
    append_rows(results_dir, "runs", [row], run_id=row["run_id"])


def feedback_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """What the next generation sees of this attempt."""
    keys = (
        "iteration",
        "outcome",
        "error_class",
        "error_excerpt",
        "runtime_ms",
        "eager_ms",
        "compile_ms",
        "speedup_eager",
        "speedup_compile",
    )
    return {key: row.get(key) for key in keys}
