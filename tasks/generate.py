"""Generation stage (agent F): propose a candidate kernel for a problem, given the last attempt's outcome.

Two agents, chosen by `RunConfig.agent`:
- `llm`: renders `prompts/generate.j2` (single shot when there is no previous attempt, refinement
  otherwise: the previous kernel with its compile log, runtime error, mismatch report or the
  performance recommendation), asks the configured model and extracts the candidate file from its reply.
- `reference` (offline, no model): proposes the flawed drafts `kernels_ref/<backend>/drafts/<id>.<n>.py`
  in order, then the working kernel `kernels_ref/<backend>/<id>.py`, so every outcome path runs
  without an endpoint.
- `identity` (offline): the problem's own file with `class ModelNew(Model): pass` appended, for every
  problem (KernelBench's included). Its speedup should be 1.00: it calibrates the harness (timing
  fidelity, memory, throughput; benchmarks/kernelbench_suite.py). Needs `allow_library_calls`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect import task

from kforge.config import ModelSettings, RunConfig
from tasks.caching import retry_when
from tasks.extract import extract_candidate
from tasks.llm import EndpointError, EndpointUnavailable, chat, cost_usd
from tasks.problems import Problem
from tasks.prompts import prompt_hash, render_messages, templates_digest

KERNELS_REF = Path(__file__).resolve().parents[1] / "kernels_ref"


@dataclass(frozen=True)
class GenerationRequest:
    problem: Problem
    backend: str
    iteration: int
    previous_source: str | None = None
    previous_feedback: dict[str, Any] | None = None  # outcome, error_class, error_excerpt, timings
    recommendation: dict[str, str] | None = None  # agent G's advice on the previous (correct) kernel
    reference_backend: str | None = None  # show the agent kernels_ref/<this>/<problem_id>.py


@dataclass(frozen=True)
class GenerationReply:
    candidate_source: str | None  # None: no usable candidate (recorded as generation_failed)
    error: str | None = None
    error_class: str | None = None  # why there is no candidate: no_code, endpoint_unavailable, endpoint_error
    exhausted: bool = False  # the agent has nothing further to propose after this reply
    model: str = "none"
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    reply_cached: bool = False
    prompt_hash: str | None = None
    agent_config: dict[str, Any] = field(default_factory=dict)


Generator = Callable[[GenerationRequest], GenerationReply]


def reference_proposals(kernels_dir: Path, backend: str, problem_id: str) -> list[Path]:
    """Drafts in order, then the working reference kernel (if there is one)."""
    drafts_dir = kernels_dir / backend / "drafts"
    pattern = re.compile(rf"^{re.escape(problem_id)}\.(\d+)\.py$")
    drafts = sorted(
        (int(m.group(1)), path)
        for path in (drafts_dir.glob(f"{problem_id}.*.py") if drafts_dir.is_dir() else [])
        if (m := pattern.match(path.name))
    )
    proposals = [path for _, path in drafts]
    reference = kernels_dir / backend / f"{problem_id}.py"
    if reference.is_file():
        proposals.append(reference)
    return proposals


def make_reference_generator(kernels_dir: Path = KERNELS_REF) -> Generator:
    def generate(request: GenerationRequest) -> GenerationReply:
        proposals = reference_proposals(kernels_dir, request.backend, request.problem.problem_id)
        config = {"agent": "reference", "kernels_dir": str(kernels_dir)}
        if not proposals:
            where = kernels_dir / request.backend
            return GenerationReply(
                None,
                error=f"no reference kernel for {request.problem.problem_id} in {where}",
                error_class="no_code",
                exhausted=True,
                agent_config=config,
            )
        index = min(request.iteration, len(proposals) - 1)
        return GenerationReply(proposals[index].read_text(), exhausted=index >= len(proposals) - 1, agent_config=config)

    return generate


def cross_reference(kernels_dir: Path, reference_backend: str | None, problem_id: str) -> dict[str, str] | None:
    """The working kernel for `problem_id` on `reference_backend`, if asked for and present."""
    if not reference_backend:
        return None
    path = kernels_dir / reference_backend / f"{problem_id}.py"
    return {"backend": reference_backend, "source": path.read_text()} if path.is_file() else None


def generation_messages(request: GenerationRequest, kernels_dir: Path = KERNELS_REF) -> list[dict[str, str]]:
    """Agent F's chat messages for `request` (single shot or refinement)."""
    previous = None
    if request.previous_source is not None or request.previous_feedback:
        previous = {"iteration": request.iteration - 1, "source": request.previous_source or "", "outcome": None}
        previous.update(request.previous_feedback or {})
    return render_messages(
        "generate",
        problem_id=request.problem.problem_id,
        problem_source=request.problem.source,
        backend=request.backend,
        reference=cross_reference(kernels_dir, request.reference_backend, request.problem.problem_id),
        previous=previous,
        recommendation=request.recommendation,
    )


def make_llm_generator(settings: ModelSettings, cache_dir: str | None, kernels_dir: Path = KERNELS_REF) -> Generator:
    """Agent F over an OpenAI-compatible model. Raises EndpointUnavailable (retryable) and nothing else."""

    def generate(request: GenerationRequest) -> GenerationReply:
        messages = generation_messages(request, kernels_dir)
        reference = cross_reference(kernels_dir, request.reference_backend, request.problem.problem_id)
        agent_config = {
            "agent": "llm",
            "model": settings.model,
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
            "reference_backend": request.reference_backend,
            "reference_shown": reference is not None,
            "recommendation_shown": request.recommendation is not None,
        }
        common = {"model": settings.model or "none", "prompt_hash": prompt_hash(messages), "agent_config": agent_config}
        try:
            reply = chat(settings, messages, cache_dir)
        except EndpointError as exc:  # a bad key or model name will not fix itself: stop this problem
            return GenerationReply(None, error=str(exc), error_class="endpoint_error", exhausted=True, **common)
        source, reason = extract_candidate(reply.text, reply.finish_reason)
        agent_config["finish_reason"] = reply.finish_reason
        return GenerationReply(
            source,
            error=reason,
            error_class=None if source else "no_code",
            tokens_in=reply.tokens_in,
            tokens_out=reply.tokens_out,
            cost_usd=0.0 if reply.cached else cost_usd(settings, reply.tokens_in, reply.tokens_out),
            reply_cached=reply.cached,
            **common,
        )

    return generate


IDENTITY_SUFFIX = "\n\nclass ModelNew(Model):  # kforge's identity candidate: the reference itself\n    pass\n"


def identity_generator(request: GenerationRequest) -> GenerationReply:
    return GenerationReply(request.problem.source + IDENTITY_SUFFIX, exhausted=True, agent_config={"agent": "identity"})


def make_generator(config: RunConfig) -> Generator:
    if config.agent == "llm":
        return make_llm_generator(config.llm, config.cache_dir)
    if config.agent == "identity":
        return identity_generator
    return make_reference_generator()


def generate_candidate(request: GenerationRequest, config: RunConfig) -> GenerationReply:
    """Ask the agent for a candidate. EndpointUnavailable propagates (the task retries it); any other
    failure becomes a reply without code, never an exception."""
    try:
        return make_generator(config)(request)
    except EndpointUnavailable:
        raise
    except (OSError, ValueError) as exc:
        return GenerationReply(None, error=f"{type(exc).__name__}: {exc}", error_class="no_code", exhausted=True)


def failed_generation(error: BaseException | None, config: RunConfig) -> GenerationReply:
    """The reply recorded when the endpoint stayed unavailable through every retry."""
    return GenerationReply(
        None,
        error=str(error) if error else "the generate task failed",
        error_class="endpoint_unavailable",
        exhausted=True,
        model=config.llm.model or "none",
    )


def _files_digest(paths: list[Path]) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths)]


def _generation_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    request: GenerationRequest = parameters["request"]
    config: RunConfig = parameters["config"]
    payload = asdict(request)
    payload["problem"] = request.problem.source_hash
    payload["agent"] = config.agent
    if config.agent == "reference":  # the offline agent's answer is a file: its content belongs in the key
        payload["proposals"] = _files_digest(
            reference_proposals(KERNELS_REF, request.backend, request.problem.problem_id)
        )
    elif config.agent == "llm":
        payload["model"] = config.llm.model_dump(include={"model", "temperature", "max_tokens"})
        payload["prompts"] = templates_digest()
        # A retry of the same run replays the reply; a new run asks again (and the reply cache answers).
        payload["run_id"] = parameters["run_id"]
    return "generate-" + hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


# Retry a model call only when the endpoint may come back (429, 5xx, timeouts, lost connections).
retry_on_endpoint = retry_when(EndpointUnavailable)


@task(
    name="generate",
    task_run_name="generate {request.problem.problem_id} #{request.iteration}",
    cache_key_fn=_generation_cache_key,
    persist_result=True,
    retry_condition_fn=retry_on_endpoint,
)
def generate_task(request: GenerationRequest, config: RunConfig, run_id: str) -> GenerationReply:
    return generate_candidate(request, config)


def backoff_delays(retries: int, first_delay_s: float) -> list[float]:
    return [first_delay_s * 2**attempt for attempt in range(retries)]
