"""Verify stage: correctness of a compiled candidate over several trials with fresh, unseen inputs."""

from __future__ import annotations

from typing import Any

from prefect import task

from kforge.config import RunConfig
from tasks.caching import content_key, retry_on_infrastructure, source_hash
from tasks.judge import evaluate_in_worker
from tasks.problems import Problem


def verify_candidate(problem: Problem, candidate_source: str, config: RunConfig) -> dict[str, Any]:
    """Outcome of the correctness trials: `correct` (with max errors and tolerances) or the failure."""
    return evaluate_in_worker("verify", problem.source, candidate_source, config)


def _cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    config: RunConfig = parameters["config"]
    problem: Problem = parameters["problem"]
    return content_key(
        "verify",
        problem.source_hash,
        source_hash(parameters["candidate_source"]),
        config.backend,
        config.effective_size_preset(),
        config.seeds("verify", config.correctness_trials),
        config.allow_library_calls,
    )


@task(
    name="verify",
    task_run_name="verify {problem.problem_id}",  # flows/synthesize.py adds the iteration
    cache_key_fn=_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_on_infrastructure,
)
def verify_task(problem: Problem, candidate_source: str, config: RunConfig) -> dict[str, Any]:
    return verify_candidate(problem, candidate_source, config)
