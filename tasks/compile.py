"""Compile stage: the static pre-check (tasks/precheck.py), then import the candidate in an isolated
worker, which builds its kernels into the cache. A pre-check rejection costs no worker and no compile.

Candidates compile at import (`load_cpp`, `load_inline`); the artifacts land in the shared
kernel cache keyed by content, so the verify and timing workers load them without rebuilding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from kforge.config import RunConfig
from tasks.caching import content_key, file_digest, retry_on_infrastructure, source_hash
from tasks.judge import evaluate_in_worker
from tasks.precheck import precheck
from tasks.problems import Problem

PRECHECK_RULES = Path(__file__).with_name("precheck.py")


def compile_candidate(problem: Problem, candidate_source: str, config: RunConfig) -> dict[str, Any]:
    """Outcome of building the candidate: `correct` (with compile_s) or compile_error/runtime_error/timeout,
    or the static pre-check's rejection (no worker started, nothing compiled)."""
    rejection = precheck(candidate_source, problem.source, config.allow_library_calls)
    if rejection is not None:
        return {**rejection, "compile_s": 0.0, "rejected_by": "precheck"}
    return evaluate_in_worker("compile", problem.source, candidate_source, config)


def _cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    config: RunConfig = parameters["config"]
    problem: Problem = parameters["problem"]
    return content_key(
        "compile",
        problem.source_hash,
        source_hash(parameters["candidate_source"]),
        config.backend,
        config.effective_size_preset(),
        config.allow_library_calls,
        file_digest(PRECHECK_RULES),
    )


@task(
    name="compile",
    task_run_name="compile {problem.problem_id}",  # flows/synthesize.py adds the iteration
    cache_key_fn=_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_on_infrastructure,
)
def compile_task(problem: Problem, candidate_source: str, config: RunConfig) -> dict[str, Any]:
    return compile_candidate(problem, candidate_source, config)
