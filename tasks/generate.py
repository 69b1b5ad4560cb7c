"""Generation stage: an agent proposes a candidate kernel for a problem, given the last attempt's outcome.

A generator is a function `GenerationRequest -> GenerationReply`, found by name with
`make_generator`. The offline `reference` agent needs no model: it proposes the flawed drafts in
`kernels_ref/<backend>/drafts/<problem_id>.<n>.py` in order, then the working kernel
`kernels_ref/<backend>/<problem_id>.py`, so every outcome path runs without an endpoint.
LLM agents (OpenAI-compatible endpoints) plug in here under their own names.
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

from tasks.problems import Problem

KERNELS_REF = Path(__file__).resolve().parents[1] / "kernels_ref"


@dataclass(frozen=True)
class GenerationRequest:
    problem: Problem
    backend: str
    iteration: int
    previous_source: str | None = None
    previous_feedback: dict[str, Any] | None = None  # outcome, error_class, error_excerpt, timings


@dataclass(frozen=True)
class GenerationReply:
    candidate_source: str | None  # None: no usable candidate (recorded as generation_failed)
    error: str | None = None
    exhausted: bool = False  # the agent has nothing further to propose after this reply
    model: str = "none"
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
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
                exhausted=True,
                agent_config=config,
            )
        index = min(request.iteration, len(proposals) - 1)
        return GenerationReply(proposals[index].read_text(), exhausted=index >= len(proposals) - 1, agent_config=config)

    return generate


GENERATORS: dict[str, Callable[..., Generator]] = {"reference": make_reference_generator}


def make_generator(agent: str, **options: Any) -> Generator:
    """The generator called `agent`; raises ValueError naming the known agents."""
    if agent not in GENERATORS:
        raise ValueError(f"unknown agent {agent!r}; known agents: {', '.join(sorted(GENERATORS))}")
    return GENERATORS[agent](**options)


def generate_candidate(request: GenerationRequest, agent: str = "reference") -> GenerationReply:
    """Ask the agent for a candidate; an agent failure becomes a reply without code, never an exception."""
    try:
        return make_generator(agent)(request)
    except (OSError, ValueError) as exc:
        return GenerationReply(None, error=f"{type(exc).__name__}: {exc}", exhausted=True)


def _generation_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    request: GenerationRequest = parameters["request"]
    payload = asdict(request)
    payload["problem"] = request.problem.source_hash
    payload["agent"] = parameters.get("agent", "reference")
    if payload["agent"] == "reference":
        # the offline agent's answer is a file: its content belongs in the key
        payload["proposals"] = [
            hashlib.sha256(p.read_bytes()).hexdigest()
            for p in reference_proposals(KERNELS_REF, request.backend, request.problem.problem_id)
        ]
    return "generate-" + hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@task(name="generate", cache_key_fn=_generation_cache_key, persist_result=True, retries=2, retry_delay_seconds=5)
def generate_task(request: GenerationRequest, agent: str = "reference") -> GenerationReply:
    return generate_candidate(request, agent)
