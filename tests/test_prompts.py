"""Prompt snapshots: a change to a template (or to what the agents are given) shows up as a diff here.

Regenerate after an intended change with `KFORGE_UPDATE_SNAPSHOTS=1 pytest tests/test_prompts.py`
and review the diff of tests/snapshots/ like code."""

import os
from pathlib import Path

import jinja2
import pytest

from tasks.analyze import analysis_messages
from tasks.generate import GenerationRequest, generation_messages
from tasks.problems import parse_problem
from tasks.prompts import render_messages
from tasks.softcheck import soft_check_messages

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = Path(__file__).parent / "snapshots"
PROBLEM = parse_problem(ROOT / "data" / "problems" / "smoke" / "1_relu.py")
PREVIOUS_SOURCE = (ROOT / "kernels_ref" / "cpu" / "drafts" / "1_relu.0.py").read_text()
TIMINGS = {
    "runtime_ms": 0.8125,
    "runtime_p10_ms": 0.8,
    "runtime_p90_ms": 0.85,
    "eager_ms": 0.4,
    "compile_ms": 0.39,
    "speedup_eager": 0.492,
    "speedup_compile": 0.48,
}
RECOMMENDATION = {"bottleneck": "memory bound", "recommendation": "use float4 loads", "expected_effect": "1.3x"}

CASES = {
    "generate_single_shot_cpu": GenerationRequest(PROBLEM, "cpu", 0),
    "generate_single_shot_cuda_with_cpu_reference": GenerationRequest(PROBLEM, "cuda", 0, reference_backend="cpu"),
    "generate_single_shot_triton": GenerationRequest(PROBLEM, "triton", 0),
    "generate_after_compile_error": GenerationRequest(
        PROBLEM,
        "cpu",
        1,
        PREVIOUS_SOURCE,
        {
            "iteration": 0,
            "outcome": "compile_error",
            "error_class": "CompileError",
            "error_excerpt": "kernel.cpp:5: error: 'out' was not declared",
        },
    ),
    "generate_after_mismatch": GenerationRequest(
        PROBLEM,
        "cpu",
        2,
        PREVIOUS_SOURCE,
        {
            "iteration": 1,
            "outcome": "numerical_mismatch",
            "error_class": "values",
            "error_excerpt": "output 0: 12 of 65536 elements outside atol=0.0001 rtol=0.0001; max abs err 0.5, "
            "max rel err 1, non-finite 0; first mismatching indices [[0, 3]]",
        },
    ),
    "generate_after_no_code": GenerationRequest(
        PROBLEM,
        "cpu",
        1,
        None,
        {"iteration": 0, "outcome": "generation_failed", "error_excerpt": "the reply has no code block"},
    ),
    "generate_after_correct_with_recommendation": GenerationRequest(
        PROBLEM, "cpu", 1, PREVIOUS_SOURCE, {"iteration": 0, "outcome": "correct", **TIMINGS}, RECOMMENDATION
    ),
}


def as_text(messages: list[dict[str, str]]) -> str:
    return "".join(f"===== {m['role']} =====\n{m['content']}" for m in messages)


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("KFORGE_UPDATE_SNAPSHOTS") == "1":
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}: run with KFORGE_UPDATE_SNAPSHOTS=1 and review it"
    assert text == path.read_text(), f"{name} changed: review, then KFORGE_UPDATE_SNAPSHOTS=1"


@pytest.mark.parametrize("name", sorted(CASES))
def test_generation_prompt_snapshot(name):
    check_snapshot(name, as_text(generation_messages(CASES[name])))


def test_analysis_prompt_snapshot():
    source = (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()
    check_snapshot("analyze", as_text(analysis_messages(PROBLEM, source, "cpu", TIMINGS, None)))


def test_soft_check_prompt_snapshot():
    source = (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()
    check_snapshot("softcheck", as_text(soft_check_messages(PROBLEM, source, "cpu", allow_library_calls=False)))


def test_a_missing_variable_fails_loudly():
    with pytest.raises(jinja2.UndefinedError, match="previous"):
        render_messages(
            "generate", problem_id="p", problem_source="x", backend="cpu", reference=None, recommendation=None
        )


def test_the_reference_and_the_feedback_reach_the_prompt():
    with_reference = as_text(generation_messages(CASES["generate_single_shot_cuda_with_cpu_reference"]))
    assert (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text().strip() in with_reference
    assert "from kforge.kernels import load_cuda" in with_reference
    assert "A working cpu kernel" not in as_text(generation_messages(CASES["generate_single_shot_cpu"]))
    mismatch = as_text(generation_messages(CASES["generate_after_mismatch"]))
    assert "max abs err 0.5" in mismatch and "first mismatching indices [[0, 3]]" in mismatch
    assert "It failed: numerical_mismatch (values)" in mismatch and PREVIOUS_SOURCE.strip() in mismatch
