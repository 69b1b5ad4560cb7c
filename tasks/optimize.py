"""Knowledge-base optimization (KernelBlaster's loop), run after a problem's iterations end with a correct kernel.

One step, from the best correct kernel so far (the parent):
1. `distil_metrics`: the parent's row (and its `profiles` rows, when profiled) as the metric names the
   knowledge base's rules use (data/knowledge/seed.json);
2. `extract_state_task`: the rules name the state; when they cannot, the model does (when one is set),
   else the most general state of the knowledge base, and the reason says so;
3. `plan_rollouts`: `knowledge.select` draws `config.rollouts` techniques, seeded by run, problem and step
   so a retried run draws the same ones; each becomes a recommendation in agent G's shape;
4. the flow generates, evaluates and records one rollout attempt per technique (`as_rollout_row`);
5. `kb_update_task`: the replay buffer updates the knowledge base (numeric, plus textual with a model),
   saves the new version in `kb_dir` and appends the update's rows to the `kb_updates` table.

What the seed's rules need and where it comes from (data/profile_metrics.json, tasks/distill.py):
dram_throughput_pct, sm_throughput_pct and achieved_occupancy_pct from Nsight Compute's SpeedOfLight and
Occupancy sections; launch_overhead_pct from the kernel times (ncu's or torch.profiler's) against the measured
runtime; dram_bytes_ratio only where the problem's minimum bytes are given. tensor_pipe_pct and
sectors_per_request are not collected yet. On the CPU backend none of them exists, so no rule matches there.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import task

from kforge.config import RunConfig
from kforge.results import append_rows, load
from tasks import distill, knowledge
from tasks.caching import content_key
from tasks.generate import GenerationRequest, retry_on_endpoint
from tasks.knowledge import KbUpdate, KnowledgeBase, Rollout, State
from tasks.llm import EndpointError, chat
from tasks.problems import Problem
from tasks.prompts import templates_digest
from tasks.record import attempt_id, feedback_from_row

SAVE_TRIES = 5  # another problem may save the same version first: update the newer one instead


@dataclass(frozen=True)
class StateChoice:
    state: str
    how: str  # one line for the log: rules, model or fallback, and why
    new_state: State | None = None  # a state the model named that the knowledge base lacked
    tokens: int = 0  # of the state call (in + out), when the model was asked


@dataclass(frozen=True)
class KbStep:
    kb: KnowledgeBase  # the version saved by this step
    path: str
    updates: tuple[KbUpdate, ...]
    notes: tuple[str, ...]  # textual-update entries left unchanged, and why
    tokens: int = 0  # of the gap-analysis calls (in + out)


def kb_dir_of(config: RunConfig) -> Path:
    """Where the run's knowledge-base versions live: `kb_dir`, else <cache_dir>/knowledge."""
    return Path(config.kb_dir) if config.kb_dir else Path(config.cache_dir) / "knowledge"


def best_correct(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The correct row with the shortest runtime (None when no row is correct and timed)."""
    timed = [r for r in rows if r["outcome"] == "correct" and (r.get("runtime_ms") or 0) > 0]
    return min(timed, key=lambda r: r["runtime_ms"]) if timed else None


# ---------------------------------------------------------------- 1. metrics


def profile_of(results_dir: str, attempt: str) -> list[dict[str, Any]]:
    """The `profiles` rows of one attempt (none when it was not profiled)."""
    profiles = load("profiles", results_dir)
    return profiles[profiles["attempt_id"] == attempt].to_dict("records")


def distil_metrics(row: dict[str, Any], profile_rows: list[dict[str, Any]]) -> dict[str, float]:
    """The metrics the state rules read, from what the attempt's row and profile have (tasks/distill.py); a
    metric that was not measured is left out (a rule on it then never holds)."""
    return distill.distil(row, profile_rows).metrics


# ---------------------------------------------------------------- 2. state


def fallback_state(kb: KnowledgeBase) -> str:
    """The most general state (fewest rules; the first of those in the document)."""
    return min(kb.states, key=lambda s: len(s.rules)).name


def choose_state(metrics: dict[str, float], kb: KnowledgeBase, config: RunConfig) -> StateChoice:
    """The rules' state; else the model's (when a model is set and it names a known state); else the fallback.
    Raises EndpointUnavailable (retryable)."""
    state, confidence = knowledge.extract_state(metrics, kb)
    if state is not None:
        return StateChoice(state, f"state {state} from the rules (confidence {confidence:.2f})")
    unsure = "no rule matched" if confidence == 0 else "the rules tied"
    measured = ", ".join(sorted(metrics)) or "none"
    tokens = 0
    if config.llm.model:
        try:
            reply = chat(config.llm, knowledge.state_prompt(metrics, kb), config.cache_dir)
            parsed, why_not = knowledge.parse_state_reply(reply.text)
            tokens = reply.tokens_in + reply.tokens_out
        except EndpointError as exc:
            parsed, why_not = None, str(exc)
        if parsed is not None and kb.state(parsed.state) is not None:
            how = f"state {parsed.state} from the model ({unsure}): {parsed.reason}"
            return StateChoice(parsed.state, how, tokens=tokens)
        if parsed is not None:  # a new state: added to the knowledge base, the fallback's techniques to start
            new = knowledge.discovered_state(parsed, kb.state(fallback_state(kb)))
            if kb.state(new.name) is not None:
                how = f"state {new.name} from the model ({unsure}): {parsed.reason}"
                return StateChoice(new.name, how, tokens=tokens)
            how = f"new state {new.name} named by the model ({unsure}): {parsed.reason}"
            return StateChoice(new.name, how, new_state=new, tokens=tokens)
        unsure = f"{unsure} and the model gave none ({why_not})"
    else:
        unsure = f"{unsure} and no model is set to ask"
    fallback = fallback_state(kb)
    how = f"state {fallback} as the fallback: {unsure}; metrics measured: {measured}"
    return StateChoice(fallback, how, tokens=tokens)


def _state_key(_context: Any, parameters: dict[str, Any]) -> str:
    config: RunConfig = parameters["config"]
    return content_key(
        "kb-state",
        parameters["metrics"],
        knowledge.to_document(parameters["kb"]),
        config.llm.model_dump(include={"model", "temperature", "max_tokens"}),
        templates_digest(),
        parameters["run_id"],  # a retry of the run replays the answer; a new run asks again
    )


@task(
    name="kb-state",
    task_run_name="kb-state {problem_id}",
    cache_key_fn=_state_key,
    persist_result=True,
    retry_condition_fn=retry_on_endpoint,
)
def extract_state_task(
    metrics: dict[str, float], kb: KnowledgeBase, config: RunConfig, run_id: str, problem_id: str
) -> StateChoice:
    return choose_state(metrics, kb, config)


# ---------------------------------------------------------------- 3. selection


def selection_rng(run_id: str, problem_id: str, step: int) -> random.Random:
    """A generator seeded by run, problem and step: a retried run draws the same techniques."""
    return random.Random(int(hashlib.sha256(f"{run_id}/{problem_id}/{step}".encode()).hexdigest()[:16], 16))


def recommendation_for(kb: KnowledgeBase, state: str, technique: str) -> dict[str, str]:
    """A technique as agent G's recommendation (bottleneck, recommendation, expected_effect), which the
    generation prompt shows beside the parent kernel."""
    entry = kb.state(state)
    optimization = entry.optimization(technique)
    gain = optimization.expected_gain or knowledge.UNTRIED_PRIOR_GAIN
    return {
        "bottleneck": f"{state}: {entry.primary_bottleneck}",
        "recommendation": f"{technique}: {optimization.description}",
        "expected_effect": f"{gain:.3g}x (knowledge base v{kb.kb_version}, {optimization.attempts} earlier attempts)",
    }


def plan_rollouts(
    kb: KnowledgeBase, state: str, config: RunConfig, run_id: str, problem_id: str, step: int
) -> list[tuple[str, dict[str, str]]]:
    """(technique, recommendation) for each rollout of the step, by weighted random choice."""
    rng = selection_rng(run_id, problem_id, step)
    techniques = knowledge.select(kb, state, config.rollouts, config.kb_temperature, rng)
    return [(t, recommendation_for(kb, state, t)) for t in techniques]


# ---------------------------------------------------------------- 4. rollouts


def rollout_request(
    problem: Problem, config: RunConfig, parent: dict[str, Any], iteration: int, recommendation: dict[str, str]
) -> GenerationRequest:
    """A refinement of the parent kernel that applies one technique."""
    return GenerationRequest(
        problem,
        config.backend,
        iteration,
        parent["candidate_source"],
        feedback_from_row(parent),
        recommendation,
        config.reference_backend,
    )


def as_rollout_row(
    row: dict[str, Any],
    problem: Problem,
    parent: dict[str, Any],
    rollout: int,
    state: str,
    technique: str,
    kb_version: int,
) -> dict[str, Any]:
    """The attempt row of rollout `rollout` (1-based: the iteration loop's rows are rollout 0), with its own
    attempt id, its parent, and the state, technique and KB version in agent_config (no schema change)."""
    agent_config = {**json.loads(row["agent_config"]), "kb_state": state, "kb_technique": technique}
    agent_config["kb_version"] = kb_version
    return {
        **row,
        "attempt_id": attempt_id(row["run_id"], problem, row["iteration"], rollout),
        "rollout": rollout,
        "parent_attempt": parent["attempt_id"],
        "agent_config": json.dumps(agent_config, sort_keys=True),
    }


# ---------------------------------------------------------------- 5. update


def measured_gain(parent: dict[str, Any], child: dict[str, Any]) -> float | None:
    """Parent time / child time for a correct child, else None."""
    if child["outcome"] != "correct" or not child.get("runtime_ms") or not parent.get("runtime_ms"):
        return None
    return parent["runtime_ms"] / child["runtime_ms"]


@functools.lru_cache(maxsize=2)
def device_name(backend: str) -> str:
    """The GPU's name for the KB's per-GPU record, as torch in this process sees it; "cpu" on the CPU backend."""
    if backend == "cpu":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else backend


def replay_entry(parent: dict[str, Any], child: dict[str, Any], state: str, technique: str, gpu: str) -> Rollout:
    """The replay-buffer entry of one rollout; notes tell the gap analysis what happened."""
    gain = measured_gain(parent, child)
    if gain is not None:
        notes = f"{child['runtime_ms']:.4g} ms against the parent's {parent['runtime_ms']:.4g} ms"
    else:
        notes = f"{child['outcome']} ({child.get('error_class') or '-'}): {(child.get('error_excerpt') or '')[-300:]}"
    return Rollout(child["attempt_id"], state, technique, gain, gpu, notes)


def _with_descriptions(kb: KnowledgeBase, described: KnowledgeBase) -> KnowledgeBase:
    """`kb` with the descriptions of `described` (the textual update's rewrites; the numbers stay kb's)."""
    states = []
    for state in kb.states:
        other = described.state(state.name)
        optimizations = tuple(
            replace(o, description=other.optimization(o.technique).description)
            if other and other.optimization(o.technique)
            else o
            for o in state.optimizations
        )
        states.append(replace(state, optimizations=optimizations))
    return replace(kb, states=tuple(states))


def updated_kb(
    base: KnowledgeBase, replay: list[Rollout], config: RunConfig
) -> tuple[KnowledgeBase, list[KbUpdate], list[str], int]:
    """One new version from `base`: the numeric update, and with a model the textual one (its gap analysis
    reads the expectations the rollouts were drawn with), both under kb_version + 1; and the gap calls' tokens."""
    numeric, updates = knowledge.numeric_update(base, replay)
    if not config.llm.model or not updates:
        return numeric, updates, [], 0
    spent = [0]

    def ask(messages: list[dict[str, str]]) -> str:
        reply = chat(config.llm, messages, config.cache_dir)
        spent[0] += reply.tokens_in + reply.tokens_out
        return reply.text

    try:
        described, rewrites, notes = knowledge.textual_update(base, replay, ask)
    except EndpointError as exc:
        return numeric, updates, [f"textual update skipped: {exc}"], spent[0]
    rewrites = [replace(u, kb_version=numeric.kb_version) for u in rewrites]
    return _with_descriptions(numeric, described), updates + rewrites, notes, spent[0]


def save_update(kb: KnowledgeBase, replay: list[Rollout], config: RunConfig) -> KbStep:
    """Update the newest saved version (another problem may have saved one since `kb` was loaded) and save
    the result; on a race for the same version number, update the winner's version instead."""
    kb_dir = kb_dir_of(config)
    if not replay:
        return KbStep(kb, str(knowledge.version_path(kb_dir, kb.kb_version)), (), ())
    for _ in range(SAVE_TRIES):
        latest = knowledge.load_latest(kb_dir)
        base = latest if latest.kb_version >= kb.kb_version else kb
        discovered = [state for state in kb.states if base.state(state.name) is None]
        for state in discovered:
            base = knowledge.with_state(base, state)
        new_kb, updates, notes, tokens = updated_kb(base, replay, config)
        updates += [discovery_update(state, new_kb.kb_version) for state in discovered]
        try:
            path = knowledge.save_version(new_kb, kb_dir)
        except FileExistsError:
            time.sleep(0.1)
            continue
        return KbStep(new_kb, str(path), tuple(updates), tuple(notes), tokens)
    raise RuntimeError(f"{kb_dir}: could not save a new knowledge-base version in {SAVE_TRIES} tries")


def discovery_update(state: State, kb_version: int) -> KbUpdate:
    """The `kb_updates` row of a state the model named (technique empty: the state itself is new)."""
    why = "; ".join(state.secondary)
    return KbUpdate(kb_version, state.name, "", None, None, f"new state ({state.primary_bottleneck}): {why}")


def kb_update_rows(step: KbStep, run_id: str, problem_id: str) -> list[dict[str, Any]]:
    """The `kb_updates` rows of one saved step."""
    created_at = datetime.now(timezone.utc)
    return [{**u.row(), "run_id": run_id, "problem_id": problem_id, "created_at": created_at} for u in step.updates]


def _update_key(_context: Any, parameters: dict[str, Any]) -> str:
    config: RunConfig = parameters["config"]
    return content_key(
        "kb-update",
        parameters["run_id"],
        parameters["problem_id"],
        parameters["step"],
        [asdict(r) for r in parameters["replay"]],
        str(kb_dir_of(config)),
        config.llm.model_dump(include={"model", "temperature", "max_tokens"}),
        templates_digest(),
    )


@task(
    name="kb-update",
    task_run_name="kb-update {problem_id} step {step}",
    cache_key_fn=_update_key,
    persist_result=True,  # a retried run does not save a second version for the same rollouts
    retry_condition_fn=retry_on_endpoint,
)
def kb_update_task(
    kb: KnowledgeBase,
    replay: list[Rollout],
    config: RunConfig,
    run_id: str,
    problem_id: str,
    step: int,
    choice: StateChoice | None = None,
) -> KbStep:
    """Save the updated knowledge base and append its rows to `kb_updates`, with a model one more row
    holding the step's model tokens (its state call, `choice`, and its gap analysis); the saved step."""
    saved = save_update(kb, replay, config)
    if config.llm.model:
        state_tokens = choice.tokens if choice else 0
        why = f"model tokens of step {step}: state {state_tokens}, gap analysis {saved.tokens}"
        ids = tuple(r.attempt_id for r in replay)
        state = choice.state if choice else ""
        spent = KbUpdate(saved.kb.kb_version, state, "", None, None, why, ids, tokens=state_tokens + saved.tokens)
        saved = replace(saved, updates=(*saved.updates, spent))
    if rows := kb_update_rows(saved, run_id, problem_id):
        append_rows(config.results_dir, "kb_updates", rows, run_id=run_id)
    return saved


def _start_key(_context: Any, parameters: dict[str, Any]) -> str:
    return content_key("kb-start", parameters["run_id"], parameters["problem_id"], str(parameters["kb_dir"]))


@task(name="kb-load", task_run_name="kb-load {problem_id}", cache_key_fn=_start_key, persist_result=True)
def load_kb_task(kb_dir: str, run_id: str, problem_id: str) -> KnowledgeBase:
    """The newest version when the problem's optimization starts; cached per run and problem, so a retried run
    draws from the version the first try drew from, and replays its rollouts instead of redoing them."""
    return knowledge.load_latest(kb_dir)
