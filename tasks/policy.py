"""The iteration policy of one problem: when to stop, and what the next iteration is told.

The flow (flows/synthesize.py) only composes tasks; the decisions between them live here, as plain
functions: a problem whose own reference fails is skipped with a reason, and each attempt hands
the next generation its kernel, its outcome and agent G's recommendation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.generate import GenerationReply
from tasks.record import feedback_from_row


@dataclass(frozen=True)
class NextIteration:
    previous_source: str | None
    feedback: dict[str, Any] | None
    recommendation: str | None
    stop: bool  # the agent has nothing more to propose


def broken_reference(problem_id: str, baseline: dict[str, Any]) -> str | None:
    """Why no candidate of this problem can be judged (its reference fails in the baseline), or None."""
    if baseline.get("outcome") == "correct":
        return None
    excerpt = baseline.get("error_excerpt")
    if baseline.get("error_class") == "out_of_memory":  # the worker's host memory limit, not the reference
        return (
            f"{problem_id}: the reference's worker went over its host memory limit, skipping the problem: "
            f"raise memory_limit_mb (a setting) for it\n{excerpt}"
        )
    return f"{problem_id}: the reference itself fails, skipping the problem\n{excerpt}"


def after_attempt(reply: GenerationReply, row: dict[str, Any], recommendation: str | None) -> NextIteration:
    """What the next iteration starts from, given this attempt's reply and recorded row."""
    return NextIteration(reply.candidate_source, feedback_from_row(row), recommendation, reply.exhausted)
