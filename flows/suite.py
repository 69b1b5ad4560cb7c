"""A whole suite: fan out over problems, record every attempt, return a summary."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import Counter
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.states import Completed, State
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.transactions import CommitMode, transaction

from flows.synthesize import synthesize_problem
from kforge.compact import compact_before
from kforge.config import RunConfig
from kforge.progress import start as start_progress
from tasks import knowledge
from tasks.isolate import STOPPING, resume_workers, stop_workers
from tasks.optimize import kb_dir_of
from tasks.problems import Problem, RejectedFile, load_suite
from tasks.profile import forget_ncu_failures
from tasks.publish import publish_task
from tasks.record import host_facts, record_run_task, run_row
from tasks.trusted import warm_profiler

DEPLOYMENT_POLL_S = 2.0  # how often the suite asks the server how its problems' flow runs stand


class SuiteFailed(Exception):
    """Some problems failed for infrastructure reasons; retrying the flow run redoes only those."""


@task(name="load-suite")
def load_suite_task(suite: str) -> tuple[list[Problem], list[RejectedFile]]:
    return load_suite(suite)


# Never cached itself: a retried run enters every problem again, whose stages replay from their own caches.
@task(name="problem", task_run_name="problem-{problem.problem_id}", cache_policy=NO_CACHE)
def problem_task(problem: Problem, config: RunConfig, run_id: str) -> list[dict[str, Any]]:
    """One problem's subflow, as a task so the suite can run several at once."""
    # Stages run inside a task join its transaction, and a failed problem would roll back the stages it
    # finished; committing each stage as it ends keeps them cached for a retry, as at the flow's top level.
    with transaction(commit_mode=CommitMode.EAGER):
        return synthesize_problem(problem, config, run_id)


@task(name="compact-results", cache_policy=NO_CACHE)
def compact_task(results_dir: str, today: date) -> None:
    compact_before(results_dir, today)


def suite_run_name() -> str:
    """The suite's flow run name in the Prefect UI: suite, backend, model and date, e.g.
    `smoke cpu gpt-4o 2026-12-01` (`reference` when no model writes the kernels)."""
    started = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    config = flow_run.parameters.get("config")
    try:
        config = config if isinstance(config, RunConfig) else RunConfig.model_validate(config or {})
    except ValueError:  # the flow's own parameter check reports the bad config; the name stays plain
        return f"run-suite {started.date().isoformat()}"
    model = config.llm.model or config.agent or "reference"
    return f"{Path(config.suite).name or config.suite} {config.backend} {model} {started.date().isoformat()}"


def seed_from(run_id: str) -> int:
    return int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16)


TOKEN_COLUMNS = (
    "tokens_in",
    "tokens_out",
    "analysis_tokens_in",
    "analysis_tokens_out",
    "soft_check_tokens_in",
    "soft_check_tokens_out",
)


def tokens_per_problem(problems: list[Any], states: list[State]) -> dict[str, int]:
    """Model tokens (in and out, every agent) each problem's recorded attempts used: the ablations' cost."""
    spent = {}
    for problem, state in zip(problems, states):
        rows = state.result() if state.is_completed() else []
        spent[problem.problem_id] = int(sum(row.get(c) or 0 for row in rows for c in TOKEN_COLUMNS))
    return spent


def final_state(summary: dict[str, Any]) -> State | dict[str, Any]:
    """The flow run's end: a Completed state named `Regressed` when `kforge compare` found regressions
    against the previous run, so the Prefect UI and `prefect flow-run ls` show it; the summary is its data."""
    if not summary.get("regressed"):
        return summary
    message = f"regressed against the previous run: `kforge compare {summary['run_id']}` lists what changed"
    return Completed(name="Regressed", message=message, data=summary)


@flow(name="run-suite", flow_run_name=suite_run_name)
def run_suite(config: RunConfig) -> dict[str, Any] | State:
    """Every problem of `config.suite` through the pipeline; returns counts per outcome (a run that
    regressed ends in a Completed state named `Regressed`, see `final_state`)."""
    logger = get_run_logger()
    # The flow run id survives a retry from the UI, so the rerun keeps its seeds and cache keys.
    run_id = str(flow_run.get_id() or uuid.uuid4())
    if config.base_seed is None:
        config = config.model_copy(update={"base_seed": seed_from(run_id)})
    resume_workers()  # an earlier run of this process may have been stopped (Ctrl-C in a notebook)
    forget_ncu_failures()  # "for the rest of the run", not of the process
    warm_profiler()  # here, on the thread that runs the flow, before the problems' threads record references
    started_at, facts = datetime.now(timezone.utc), host_facts()
    problems, rejected = load_suite_task(config.suite)
    logger.info("run %s: %d problems from %s, backend %s", run_id, len(problems), config.suite, config.backend)
    for rejected_file in rejected:
        logger.warning("skipped %s", rejected_file)
    record_run_task(run_row(run_id, config, "running", started_at, facts), config.results_dir)
    kb_versions = {}
    if config.optimize == "kb" and config.kb_memory:
        kb_versions["kb_version_start"] = knowledge.load_latest(kb_dir_of(config)).kb_version

    # The runner is made here, not on the decorator, so the config decides the fan-out however the
    # flow is started (kforge run, kforge retry, Retry in the UI, run-grid).
    progress = start_progress(len(problems))  # kforge run's bar or lines; nothing in a deployment
    if config.problem_deployment:
        states = problems_by_deployment(problems, config, run_id, progress)
    else:
        states = _problems_here(problems, config, run_id, progress, logger)
    return _finish(problems, rejected, states, config, run_id, started_at, facts, kb_versions)


def _problems_here(problems: list[Problem], config: RunConfig, run_id: str, progress: Any, logger: Any) -> list[State]:
    """Every problem in this process, `effective_parallel_problems` at a time, as a task each."""
    with ThreadPoolTaskRunner(max_workers=config.effective_parallel_problems()) as runner:
        futures = [runner.submit(problem_task, {"problem": p, "config": config, "run_id": run_id}) for p in problems]
        problem_of = {future: problem for future, problem in zip(futures, problems)}
        try:
            for future in as_completed(futures):  # all of them: leaving the runner cancels what is still running
                future.wait()  # the done callback can come before the future holds its final state (and its data)
                if progress is not None:
                    state = future.state
                    problem_id = problem_of[future].problem_id
                    progress.problem_done(problem_id, state.result() if state.is_completed() else [])
        except BaseException:  # SIGTERM (Prefect's TerminationSignal), Ctrl-C: end the stages in flight now
            stop_workers()
            logger.error("stopping: %s", STOPPING.replace("RUN_ID", run_id))
            raise
    return [future.state for future in futures]


def problems_by_deployment(problems: list[Problem], config: RunConfig, run_id: str, progress: Any) -> list[State]:
    """Every problem as a flow run of `config.problem_deployment` (subflows of this run in the UI), left
    to whichever worker of its pool takes it; each one's rows are read back from the shared results.
    A problem's flow run is keyed by run and problem, so a retried suite run finds the ones it started:
    a finished one is read again, a failed or crashed one is set to run again (its finished stages
    replay from their caches), as the UI's Retry does."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import AwaitingRetry, Failed

    from kforge.results import load

    logger = get_run_logger()
    child_config = config.model_copy(update={"problem_deployment": None})
    flow_runs = {}
    with get_client(sync_client=True) as client:
        for problem in problems:
            started = run_deployment(
                config.problem_deployment,
                parameters={"problem": problem, "config": child_config, "run_id": run_id},
                timeout=0,
                idempotency_key=f"{run_id}:{problem.problem_id}",
            )
            if started.state is not None and (started.state.is_failed() or started.state.is_crashed()):
                client.set_flow_run_state(started.id, AwaitingRetry(message=f"retry of suite run {run_id}"), force=True)
            flow_runs[problem.problem_id] = started.id
        logger.info("%d problems handed to deployment %s", len(problems), config.problem_deployment)
        states: dict[str, State] = {}
        while len(states) < len(problems):
            for problem_id, flow_run_id in flow_runs.items():
                child = None if problem_id in states else client.read_flow_run(flow_run_id)
                if child is None or child.state is None or not child.state.is_final():
                    continue
                if child.state.is_completed():
                    attempts = load("attempts", config.results_dir)
                    mine = attempts[(attempts["run_id"] == run_id) & (attempts["problem_id"] == problem_id)]
                    rows = mine.sort_values("created_at").to_dict("records")
                    states[problem_id] = Completed(data=rows)
                else:
                    rows = []
                    states[problem_id] = Failed(message=f"flow run {flow_run_id}: {child.state.message}")
                if progress is not None:
                    progress.problem_done(problem_id, rows)
            if len(states) < len(problems):
                time.sleep(DEPLOYMENT_POLL_S)
    return [states[problem.problem_id] for problem in problems]


def _finish(
    problems: list[Problem],
    rejected: list[RejectedFile],
    states: list[State],
    config: RunConfig,
    run_id: str,
    started_at: datetime,
    facts: dict[str, Any],
    kb_versions: dict[str, Any],
) -> dict[str, Any] | State:
    logger = get_run_logger()

    outcomes: Counter[str] = Counter()
    failed_problems: dict[str, str] = {}
    broken_problems: list[str] = []  # the reference itself fails; see the flow run's log
    for problem, state in zip(problems, states):  # in suite order, whatever order they finished in
        if state.is_completed():
            rows = state.result()
            outcomes.update(row["outcome"] for row in rows)
            if not rows:
                broken_problems.append(problem.problem_id)
            if unreachable := [row for row in rows if row["error_class"] == "endpoint_unavailable"]:
                failed_problems[problem.problem_id] = unreachable[-1]["error_excerpt"]
        else:
            failed_problems[problem.problem_id] = state.message or "failed"

    summary = {
        "run_id": run_id,
        "problems": len(problems),
        "tokens": tokens_per_problem(problems, states),
        **kb_versions,
        "outcomes": dict(outcomes),
        "rejected_files": [str(r) for r in rejected],
        "failed_problems": failed_problems,
        "broken_problems": broken_problems,
        "results_dir": config.results_dir,
    }
    if "kb_version_start" in kb_versions:
        summary["kb_version_end"] = knowledge.load_latest(kb_dir_of(config)).kb_version
    status = "failed" if failed_problems else "finished"
    record_run_task(run_row(run_id, config, status, started_at, facts, summary), config.results_dir)
    published = publish_task(summary, config, return_state=True)  # the UI's table and summary artifacts
    if published.is_completed():
        summary["regressed"] = published.result()
    else:
        logger.warning("the run's Prefect artifacts were not published: %s", published.message)
    compact_task(config.results_dir, started_at.date())  # earlier days' partitions: one file each
    if failed_problems:
        raise SuiteFailed(
            f"{len(failed_problems)} problem(s) failed: {', '.join(failed_problems)}; "
            f"`kforge retry {run_id}` (or Retry in the Prefect UI) redoes only what failed"
        )
    return final_state(summary)
