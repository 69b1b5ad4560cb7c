"""One problem: generate -> compile -> verify -> time, the outcome feeding the next iteration."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from kforge.config import RunConfig
from tasks import gpus, knowledge, trace
from tasks.analyze import analyze_task, failed_analysis, profile_for_analysis, wants_analysis, with_analysis
from tasks.compile import compile_task
from tasks.distill import distil
from tasks.drive import device_admission
from tasks.generate import GenerationRequest, backoff_delays, failed_generation, generate_task
from tasks.measure import baseline_task, time_task
from tasks.memory import gib
from tasks.optimize import (
    as_rollout_row,
    best_correct,
    device_name,
    distil_metrics,
    extract_state_task,
    kb_dir_of,
    kb_update_task,
    load_kb_task,
    plan_rollouts,
    profile_of,
    replay_entry,
    rollout_request,
)
from tasks.policy import after_attempt, broken_reference
from tasks.problems import Problem
from tasks.profile import profile_rows, profile_task, record_profile_task
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
    with trace.for_problem(problem.problem_id), trace.span("problem"), gpus.problem_gpu(config) as config:
        if len(config.gpus or ()) > 1:
            get_run_logger().info("%s runs on GPU %d of %s", problem.problem_id, config.gpu_index, config.gpus)
        with contextlib.ExitStack() as admission:  # the device's memory, from the baseline to the end
            return _synthesize(problem, config, run_id, admission)


def _admit(problem: Problem, config: RunConfig, admission: contextlib.ExitStack) -> None:
    def waiting(reserved: int, holders: int) -> None:
        get_run_logger().info(
            "%s waits for device memory: %d problems in flight hold %s of the plan's budget",
            problem.problem_id,
            holders,
            gib(reserved),
        )

    try:
        with trace.span("admission"):
            admission.enter_context(device_admission(problem.source, config, waiting))
    except Exception as exc:  # planning runs the reference; its failure is the baseline stage's to report
        get_run_logger().warning("%s runs without a memory plan: %s", problem.problem_id, str(exc)[:300])


def _synthesize(
    problem: Problem, config: RunConfig, run_id: str, admission: contextlib.ExitStack
) -> list[dict[str, Any]]:
    baseline: dict[str, Any] = {}  # measured once the agent has produced a candidate
    measured = False
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
            first_baseline = not measured  # admitted and measured once, whatever the baseline holds
            if first_baseline:
                _admit(problem, config, admission)
                baseline, measured = baseline_task(problem, config), True
            if reason := broken_reference(problem.problem_id, baseline):
                get_run_logger().error(reason)
                return rows
            if config.profile and first_baseline:
                _profile(problem, None, config, run_id, None, None)
            stage_results = evaluate_candidate(problem, reply.candidate_source, config, baseline, iteration)
        parent = rows[-1]["attempt_id"] if rows else None
        row = attempt_row(run_id, problem, config, iteration, reply, stage_results, baseline, parent)
        profiled: list[dict[str, Any]] = []
        if config.profile and row["outcome"] == "correct":
            profiled = _profile(problem, reply.candidate_source, config, run_id, row["attempt_id"], iteration)
        if wants_soft_check(config, row):
            state = _model_task(soft_check_task, config, problem, iteration)(
                problem, reply.candidate_source, config, run_id, return_state=True
            )
            soft_check = state.result() if state.is_completed() else failed_soft_check(state.result(False))
            row = with_soft_check(row, soft_check)  # beside the outcome, which it never changes
        recommendation = None
        if wants_analysis(config, row, iteration):
            profile = None  # agent G sees the distilled profile, as text or a chart, unless told times only
            if profiled and not config.cycles_only:
                min_bytes = stage_results.get("time", {}).get("min_bytes")
                profile = profile_for_analysis(distil(row, profiled, min_bytes), config.profile_format)
            state = _model_task(analyze_task, config, problem, iteration)(
                problem, reply.candidate_source, row, config, run_id, profile, return_state=True
            )
            analysis = state.result() if state.is_completed() else failed_analysis(state.result(False))
            row, recommendation = with_analysis(row, analysis), analysis.recommendation
        rows.append(record_attempt_task(row, config.results_dir))
        step = after_attempt(reply, row, recommendation)
        previous_source, feedback, recommendation = step.previous_source, step.feedback, step.recommendation
        if step.stop:
            break
    if config.optimize == "kb":
        rows += _optimize(problem, config, run_id, rows, baseline)
    return rows


def _profile(
    problem: Problem, source: str | None, config: RunConfig, run_id: str, attempt_id: str | None, iteration: int | None
) -> list[dict[str, Any]]:
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
    return profile_rows(profiled, run_id, problem.problem_id, attempt_id)


def _optimize(
    problem: Problem, config: RunConfig, run_id: str, rows: list[dict[str, Any]], baseline: dict[str, Any]
) -> list[dict[str, Any]]:
    """The knowledge-base loop (tasks/optimize.py): `config.depth` steps, each drawing `config.rollouts`
    techniques for the best kernel's state, trying each as a rollout and updating the KB from the gains."""
    logger = get_run_logger()
    parent = best_correct(rows)
    if parent is None:
        logger.info("%s: no correct kernel, no knowledge-base optimization", problem.problem_id)
        return []
    if not config.kb_memory:  # the ablation: this problem's own folder, starting from the seed
        no_memory = Path(config.cache_dir) / "kb-no-memory" / run_id / problem.problem_id
        config = config.model_copy(update={"kb_dir": str(no_memory)})
    kb = load_kb_task(str(kb_dir_of(config)), run_id, problem.problem_id)
    logger.info("%s: knowledge base v%d at the start (%s)", problem.problem_id, kb.kb_version, kb_dir_of(config))
    first_version, children = kb.kb_version, []
    for step in range(config.depth):
        iteration = rows[-1]["iteration"] + 1 + step
        profiled = [] if config.cycles_only else profile_of(config.results_dir, parent["attempt_id"])
        metrics = distil_metrics(parent, profiled)
        choice = _model_task(extract_state_task, config, problem, iteration)(
            metrics, kb, config, run_id, problem.problem_id
        )
        if choice.new_state is not None:  # saved with this step's update, a kb_updates row saying so
            kb = knowledge.with_state(kb, choice.new_state)
        plan = plan_rollouts(kb, choice.state, config, run_id, problem.problem_id, step)
        logger.info("%s: %s; rollouts: %s", problem.problem_id, choice.how, ", ".join(t for t, _ in plan))
        replay = []
        for rollout, (technique, recommendation) in enumerate(plan, start=1):
            labels = (rollout, choice.state, technique, kb.kb_version)
            rollout_row = _rollout(problem, config, run_id, baseline, parent, iteration, labels, recommendation)
            children.append(record_attempt_task(rollout_row, config.results_dir))
            replay.append(replay_entry(parent, rollout_row, choice.state, technique, device_name(config.backend)))
        update = _model_task(kb_update_task, config, problem, iteration)
        saved = update(kb, replay, config, run_id, problem.problem_id, step, choice)
        for note in saved.notes:
            logger.info("%s: %s", problem.problem_id, note)
        kb, parent = saved.kb, best_correct([parent, *children])
    logger.info("%s: knowledge base v%d -> v%d", problem.problem_id, first_version, kb.kb_version)
    return children


def _rollout(
    problem: Problem,
    config: RunConfig,
    run_id: str,
    baseline: dict[str, Any],
    parent: dict[str, Any],
    iteration: int,
    labels: tuple[int, str, str, int],
    recommendation: dict[str, str],
) -> dict[str, Any]:
    """One technique applied to the parent kernel, generated, evaluated (and profiled when asked); its row,
    labelled (rollout, state, technique, KB version) by `as_rollout_row`, not yet recorded."""
    request = rollout_request(problem, config, parent, iteration, recommendation)
    state = _model_task(generate_task, config, problem, iteration)(request, config, run_id, return_state=True)
    reply = state.result() if state.is_completed() else failed_generation(state.result(False), config)
    stage_results = {}
    if reply.candidate_source:
        stage_results = evaluate_candidate(problem, reply.candidate_source, config, baseline, iteration)
    row = attempt_row(run_id, problem, config, iteration, reply, stage_results, baseline, parent["attempt_id"])
    row = as_rollout_row(row, problem, parent, *labels)
    if config.profile and row["outcome"] == "correct":
        _profile(problem, reply.candidate_source, config, run_id, row["attempt_id"], iteration)
    return row
