"""One problem: generate -> compile -> verify -> time, the outcome feeding the next iteration."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from kforge.config import RunConfig
from tasks.analyze import analyze_task, failed_analysis, wants_analysis, with_analysis
from tasks.compile import compile_task
from tasks.generate import GenerationRequest, backoff_delays, failed_generation, generate_task
from tasks.measure import baseline_task, time_task
from tasks.policy import after_attempt, broken_reference
from tasks.problems import Problem
from tasks.profile import profile_task, record_profile_task
from tasks.record import attempt_row, record_attempt_task
from tasks.softcheck import failed_soft_check, needs_model_notice, soft_check_task, wants_soft_check, with_soft_check
from tasks.verify import verify_task


def run_name(stage: str, problem: Problem, iteration: int | None) -> str:
    """A task run's name in the Prefect UI: `compile 1_relu #0` (stage, problem id, iteration)."""
    name = f"{stage} {problem.problem_id}" + (f" #{iteration}" if iteration is not None else "")
    return name.replace("{", "{{").replace("}", "}}")  # Prefect formats the name with the task's parameters


def evaluate_candidate(
    problem: Problem,
    candidate_source: str,
    config: RunConfig,
    baseline: dict[str, Any] | None = None,
    iteration: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the stages in order, stopping at the first one that does not pass; `iteration` names the task runs."""
    compile_, verify, time = (
        stage_task.with_options(task_run_name=run_name(stage_task.name, problem, iteration))
        for stage_task in (compile_task, verify_task, time_task)
    )
    stage_results = {"compile": compile_(problem, candidate_source, config)}
    if stage_results["compile"]["outcome"] == "correct":
        stage_results["verify"] = verify(problem, candidate_source, config)
    if stage_results.get("verify", {}).get("outcome") == "correct":
        stage_results["time"] = time(problem, candidate_source, config, baseline)
    return stage_results


def _model_task(model_task, config: RunConfig, problem: Problem, iteration: int):
    """`model_task` with the run's retry policy for endpoint failures (exponential backoff), named after
    the problem and iteration."""
    return model_task.with_options(
        retries=config.llm.retries,
        retry_delay_seconds=backoff_delays(config.llm.retries, config.llm.retry_delay_s),
        task_run_name=run_name(model_task.name, problem, iteration),
    )


@flow(name="synthesize-problem", flow_run_name="{problem.problem_id}")
def synthesize_problem(problem: Problem, config: RunConfig, run_id: str) -> list[dict[str, Any]]:
    """All attempts for one problem: the single-shot one, then `config.iterations` refinements."""
    baseline: dict[str, Any] = {}  # measured once the agent has produced a candidate
    rows: list[dict[str, Any]] = []
    previous_source, feedback, recommendation = None, None, None
    if notice := needs_model_notice(config, run_id):
        get_run_logger().warning(notice)
    for iteration in range(config.iterations + 1):
        request = GenerationRequest(
            problem, config.backend, iteration, previous_source, feedback, recommendation, config.reference_backend
        )
        state = _model_task(generate_task, config, problem, iteration)(request, config, run_id, return_state=True)
        reply = state.result() if state.is_completed() else failed_generation(state.result(False), config)
        stage_results = {}
        if reply.candidate_source:
            first_baseline = not baseline
            baseline = baseline or baseline_task(problem, config)
            if reason := broken_reference(problem.problem_id, baseline):
                get_run_logger().error(reason)
                return rows
            if config.profile and first_baseline:
                _profile(problem, None, config, run_id, None, None)
            stage_results = evaluate_candidate(problem, reply.candidate_source, config, baseline, iteration)
        parent = rows[-1]["attempt_id"] if rows else None
        row = attempt_row(run_id, problem, config, iteration, reply, stage_results, baseline, parent)
        if config.profile and row["outcome"] == "correct":
            _profile(problem, reply.candidate_source, config, run_id, row["attempt_id"], iteration)
        if wants_soft_check(config, row):
            state = _model_task(soft_check_task, config, problem, iteration)(
                problem, reply.candidate_source, config, run_id, return_state=True
            )
            soft_check = state.result() if state.is_completed() else failed_soft_check(state.result(False))
            row = with_soft_check(row, soft_check)  # beside the outcome, which it never changes
        recommendation = None
        if wants_analysis(config, row, iteration):
            state = _model_task(analyze_task, config, problem, iteration)(
                problem, reply.candidate_source, row, config, run_id, return_state=True
            )
            analysis = state.result() if state.is_completed() else failed_analysis(state.result(False))
            row, recommendation = with_analysis(row, analysis), analysis.recommendation
        rows.append(record_attempt_task(row, config.results_dir))
        step = after_attempt(reply, row, recommendation)
        previous_source, feedback, recommendation = step.previous_source, step.feedback, step.recommendation
        if step.stop:
            break
    return rows


def _profile(
    problem: Problem, source: str | None, config: RunConfig, run_id: str, attempt_id: str | None, iteration: int | None
) -> None:
    """Profile a correct candidate (or, `source` None, the reference) into the `profiles` table:
    advisory numbers for the agents, never a verdict or a time (tasks/profile.py)."""
    model = "candidate" if source is not None else "reference"
    name = run_name("profile" if source is not None else "profile-reference", problem, iteration)
    profiled = profile_task.with_options(task_run_name=name)(problem, source, config, model)
    if profiled.get("warning"):
        get_run_logger().warning(profiled["warning"])
    if profiled.get("outcome") != "correct":
        get_run_logger().warning("%s: no profile (%s)", name, profiled.get("error_class"))
    record_profile_task(profiled, run_id, problem.problem_id, attempt_id, config.results_dir)
