"""Soft check: the model's second opinion on a kernel the mechanical checks found correct.

It asks whether the kernel still computes the whole reference function, with native kernel code only
(`prompts/softcheck.j2`), and reads one JSON object {verdict: pass | fail, reason}. The verdict is
recorded in its own columns beside the attempt's outcome and never changes it: the pre-check and
verify decide correctness without a model (see INTEGRITY.md); this is the papers' second line.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefect import task

from kforge.config import RunConfig
from tasks.generate import retry_on_endpoint
from tasks.llm import EndpointError, chat, cost_usd
from tasks.problems import Problem
from tasks.prompts import prompt_hash, render_messages, templates_digest

VERDICTS = ("pass", "fail")


@dataclass(frozen=True)
class SoftCheck:
    verdict: str | None  # "pass" or "fail"; None when the check gave no verdict (see error)
    reason: str | None = None
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    prompt_hash: str | None = None


def _json_objects(reply_text: str) -> Iterator[Any]:
    """JSON values in a reply: fenced blocks first, then the text from the first '{' to the last '}'."""
    fenced = re.findall(r"```(?:json)?\s*\n(.*?)```", reply_text, flags=re.DOTALL)
    start, end = reply_text.find("{"), reply_text.rfind("}")
    for text in [*fenced, reply_text[start : end + 1] if 0 <= start < end else ""]:
        try:
            yield json.loads(text)
        except ValueError:
            continue


def parse_verdict(reply_text: str) -> tuple[str | None, str | None, str | None]:
    """(verdict, reason, None) from a reply holding {"verdict": "pass" | "fail", "reason": "..."},
    or (None, None, why not)."""
    for parsed in _json_objects(reply_text):
        verdict = parsed.get("verdict") if isinstance(parsed, dict) else None
        if isinstance(verdict, str) and verdict.strip().lower() in VERDICTS:
            reason = parsed.get("reason")
            return verdict.strip().lower(), reason.strip() if isinstance(reason, str) and reason.strip() else None, None
    return None, None, 'the soft-check reply has no JSON object with "verdict": "pass" or "fail"'


def soft_check_messages(problem: Problem, candidate_source: str, backend: str, allow_library_calls: bool):
    return render_messages(
        "softcheck",
        problem_id=problem.problem_id,
        problem_source=problem.source,
        backend=backend,
        candidate_source=candidate_source,
        allow_library_calls=allow_library_calls,
    )


def soft_check_kernel(problem: Problem, candidate_source: str, config: RunConfig) -> SoftCheck:
    """The model's verdict on a correct kernel. Raises EndpointUnavailable (retryable); any other
    failure (a refused request, a reply without a verdict) is a SoftCheck without a verdict, with the reason."""
    messages = soft_check_messages(problem, candidate_source, config.backend, config.allow_library_calls)
    digest = prompt_hash(messages)
    try:
        reply = chat(config.llm, messages, config.cache_dir)
    except EndpointError as exc:
        return SoftCheck(None, error=str(exc), prompt_hash=digest)
    verdict, reason, error = parse_verdict(reply.text)
    return SoftCheck(
        verdict,
        reason=reason,
        error=error,
        tokens_in=reply.tokens_in,
        tokens_out=reply.tokens_out,
        cost_usd=0.0 if reply.cached else cost_usd(config.llm, reply.tokens_in, reply.tokens_out),
        prompt_hash=digest,
    )


def failed_soft_check(error: BaseException | None) -> SoftCheck:
    """No verdict: the endpoint stayed unavailable through every retry."""
    return SoftCheck(None, error=str(error) if error else "the soft-check task failed")


def _soft_check_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    config: RunConfig = parameters["config"]
    payload = [
        parameters["problem"].source_hash,
        parameters["candidate_source"],
        config.backend,
        config.allow_library_calls,
        config.llm.model_dump(include={"model", "temperature", "max_tokens"}),
        templates_digest(),
        parameters["run_id"],
    ]
    return "softcheck-" + hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@task(name="soft-check", cache_key_fn=_soft_check_cache_key, persist_result=True, retry_condition_fn=retry_on_endpoint)
def soft_check_task(problem: Problem, candidate_source: str, config: RunConfig, run_id: str) -> SoftCheck:
    return soft_check_kernel(problem, candidate_source, config)


def wants_soft_check(config: RunConfig, row: dict[str, Any]) -> bool:
    """The soft check runs on every correct kernel when asked for and a model is configured."""
    return config.soft_check and config.agent == "llm" and row["outcome"] == "correct"


_RUNS_TOLD: set[str] = set()  # runs already told that the soft check is off for want of a model
_RUNS_TOLD_LOCK = threading.Lock()  # a suite may run its problems' flows in threads


def needs_model_notice(config: RunConfig, run_id: str) -> str | None:
    """The one-line notice that the soft check asked for cannot run without a model, the first time
    a run asks (each problem's flow asks); None otherwise."""
    if not config.soft_check or config.agent == "llm":
        return None
    with _RUNS_TOLD_LOCK:
        if run_id in _RUNS_TOLD:
            return None
        _RUNS_TOLD.add(run_id)
    return "the soft check needs a model (--model NAME): no soft-check verdicts are recorded in this run"


def with_soft_check(row: dict[str, Any], soft_check: SoftCheck) -> dict[str, Any]:
    """The attempt row with the soft check's verdict, reason or error, tokens and cost added; the
    outcome stays what the mechanical checks decided."""
    return {
        **row,
        "soft_check": soft_check.verdict,
        "soft_check_reason": soft_check.reason,
        "soft_check_error": soft_check.error,
        "soft_check_tokens_in": soft_check.tokens_in,
        "soft_check_tokens_out": soft_check.tokens_out,
        "cost_usd": (row.get("cost_usd") or 0.0) + soft_check.cost_usd,
    }
