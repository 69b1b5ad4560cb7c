"""Run one evaluation request in a fresh, limited worker process and read back its outcome.

The untrusted candidate never runs in this (the orchestrating) process. Each worker gets its own
temporary working directory, its own process session (so a hang is killed with all its children),
CPU-time and address-space limits, and an environment stripped of everything but what compilers
and torch need (no API keys). The worker applies its CPU and memory limits to itself before it
touches candidate code (no preexec_fn: this process runs Prefect's threads). A crash, hang or
memory blow-up becomes an outcome with the tail of the worker's log; only a failure to start the
worker at all is an infrastructure error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kforge.config import RunConfig
from kforge.results import OUTCOMES

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LOG_TAIL_CHARS = 4000
# Passed through to the worker; everything else (API keys, cloud credentials) stays behind.
ENV_ALLOWED = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "KFORGE_CUDA_ARCH",
    "CC",
    "CXX",
    "VIRTUAL_ENV",
    "TRITON_CACHE_DIR",
    "NVIDIA_VISIBLE_DEVICES",
)


class InfrastructureError(Exception):
    """The worker could not be run at all (not the candidate's fault); worth retrying."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 120.0
    cpu_s: int = 600
    memory_mb: int | None = 8192  # address space; None where a CUDA context's reservations forbid it


def _worker_env(kernel_cache: Path, threads: int | None) -> dict[str, str]:
    env = {key: os.environ[key] for key in ENV_ALLOWED if key in os.environ}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env["KFORGE_KERNEL_CACHE"] = str(kernel_cache)
    env["TORCH_EXTENSIONS_DIR"] = str(kernel_cache / "torch_extensions")
    # torch.compile baselines reuse inductor's cache across workers and runs (25 s -> 7 s on 2 cores)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(kernel_cache / "inductor")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _log_tail(log_path: Path) -> str:
    try:
        text = log_path.read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace")
    except OSError:
        return ""
    return text


def _read_result(result_path: Path) -> dict[str, Any] | None:
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("outcome") not in OUTCOMES:
        return None
    return result


def _outcome_from_exit(returncode: int, log: str, limits: Limits) -> dict[str, Any]:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        if name == "SIGXCPU":
            return {
                "outcome": "timeout",
                "error_class": "cpu_time_limit",
                "error_excerpt": f"exceeded the CPU-time limit of {limits.cpu_s} s\n{log}",
            }
        return {
            "outcome": "runtime_error",
            "error_class": name,
            "error_excerpt": f"worker killed by {name}\n{log}",
        }
    return {
        "outcome": "runtime_error",
        "error_class": "no_result",
        "error_excerpt": f"worker exited with code {returncode} without a valid result\n{log}",
    }


def run_worker(
    request: dict[str, Any], limits: Limits, kernel_cache: Path, threads: int | None = None
) -> dict[str, Any]:
    """Evaluate `request` (see tasks.harness.worker) in a fresh process; return the outcome dict,
    always with `outcome`, plus `worker_s` (wall time of the whole process)."""
    kernel_cache.mkdir(parents=True, exist_ok=True)
    try:
        control_dir = tempfile.TemporaryDirectory(prefix="kforge-ctl-")
        work_dir = tempfile.TemporaryDirectory(prefix="kforge-run-")
    except OSError as exc:
        raise InfrastructureError(f"cannot create a worker directory: {exc}") from exc
    with control_dir as control, work_dir as work:
        request_path, result_path = Path(control) / "request.json", Path(control) / "result.json"
        log_path = Path(control) / "worker.log"
        limits_for_worker = {"cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb}
        request_path.write_text(json.dumps({**request, "threads": threads, "limits": limits_for_worker}))
        start = time.perf_counter()
        try:
            with open(log_path, "wb") as log_file:
                process = subprocess.Popen(
                    [sys.executable, "-m", "tasks.harness.worker", str(request_path), str(result_path)],
                    cwd=work,
                    env=_worker_env(kernel_cache, threads),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            raise InfrastructureError(f"cannot start the evaluation worker: {exc}") from exc
        try:
            returncode = process.wait(timeout=limits.wall_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_session(process)
        worker_s = time.perf_counter() - start
        log = _log_tail(log_path)
        if timed_out:
            result = {
                "outcome": "timeout",
                "error_class": "wall_time_limit",
                "error_excerpt": f"no result after {limits.wall_s:g} s\n{log}",
            }
        else:
            result = _read_result(result_path) or _outcome_from_exit(returncode, log, limits)
    result["worker_s"] = worker_s
    return result


def _kill_session(process: subprocess.Popen) -> None:
    """Kill the worker and anything it spawned, then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def evaluate_in_worker(
    mode: str, problem_source: str, candidate_source: str | None, config: RunConfig
) -> dict[str, Any]:
    """Build the worker request for `mode` from the run's settings and run it isolated."""
    seeds = (
        config.seeds("time", 3) if mode in ("time", "baseline") else config.seeds("verify", config.correctness_trials)
    )
    request = {
        "mode": mode,
        "problem_source": problem_source,
        "candidate_source": candidate_source,
        "backend": config.backend,
        "size_preset": config.effective_size_preset(),
        "init_seed": config.seeds("init", 1)[0],
        "seeds": seeds,
        "torch_compile": config.torch_compile_baseline,
        "timing": {
            "warmup_runs": config.warmup_runs,
            "min_runs": config.min_timed_runs,
            "max_runs": config.max_timed_runs,
            "budget_s": config.timing_budget_s,
        },
    }
    wall_s = config.compile_timeout_s if mode in ("compile", "baseline") else config.run_timeout_s
    memory_mb = config.memory_limit_mb if config.backend == "cpu" else None
    limits = Limits(wall_s=wall_s, cpu_s=int(wall_s * 4) + 10, memory_mb=memory_mb)
    return run_worker(request, limits, Path(config.cache_dir) / "kernels", config.threads)
