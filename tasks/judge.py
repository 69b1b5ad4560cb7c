"""Where each stage is decided: compile in a worker's own result, the rest by the orchestrator.

The compile stage's worker imports the candidate (its kernels build at import) and says whether
that worked: a claim that can only cost the candidate, since nothing it reports is a measurement.
Verify, time and baseline are sessions the orchestrator drives call by call (tasks/drive.py): it
makes every input, clocks every call and compares the outputs with the reference's itself, with
the comparisons of tasks/harness/checks.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kforge.config import RunConfig
from tasks import drive, slots
from tasks.harness import extensions
from tasks.isolate import InfrastructureError, check_stopping, run_worker
from tasks.pool import worker_pool


def evaluate_in_worker(
    mode: str,
    problem_source: str,
    candidate_source: str | None,
    config: RunConfig,
    trusted_echo_ms: float | None = None,
    trusted_echo_cpu_ms: float | None = None,
) -> dict[str, Any]:
    """Run stage `mode` (compile | verify | time | baseline) of a candidate, or of the reference
    alone (baseline), in isolated workers; `trusted_echo_ms` and `trusted_echo_cpu_ms` are the
    baseline's round trip and CPU time of an empty call, which bound a timed candidate's (tasks/drive.py)."""
    if candidate_source and "load_inline" in candidate_source and os.environ.get("KFORGE_INLINE_BUILD") != "plain":
        extensions.prepare_header(Path(config.cache_dir) / "kernels")  # once per toolchain
    if mode in ("verify", "time", "baseline"):

        def stage() -> dict[str, Any]:
            if mode == "verify":
                return drive.verify(problem_source, candidate_source or "", config)
            if mode == "time":
                return drive.time_candidate(
                    problem_source, candidate_source or "", config, trusted_echo_ms, trusted_echo_cpu_ms
                )
            return drive.time_baselines(problem_source, config)

        result = stage()
        check_stopping()
        if result.get("error_class") == drive.HARNESS_OUT_OF_MEMORY and not slots.holding_alone():
            with slots.alone_on_host(config.backend):  # the other problems' stages hold memory too
                result = stage()
        if result.get("error_class") == drive.HARNESS_OUT_OF_MEMORY:  # the stage's task retries it
            raise InfrastructureError(result["error_excerpt"] + " (also when retried alone on the host)")
        return result
    if mode != "compile":
        raise ValueError(f"no stage {mode!r}")
    request = drive._request("compile", problem_source, candidate_source, config, "candidate")
    pool = worker_pool(config.effective_worker_pool())
    limits = drive._limits("compile", config, problem_source)
    return run_worker(request, limits, Path(config.cache_dir) / "kernels", config.threads, pool)
