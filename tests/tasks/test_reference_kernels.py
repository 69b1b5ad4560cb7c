"""The CPU reference kernels pass verification on their smoke problems; each draft fails as intended."""

from pathlib import Path

import pytest

from tasks.measure import speedups
from tasks.problems import parse_problem
from tasks.verify import verify_candidate

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "data" / "problems" / "smoke"
KERNELS = ROOT / "kernels_ref" / "cpu"
REFERENCE_KERNELS = sorted(KERNELS.glob("*.py"))
DRAFT_OUTCOMES = {
    "1_relu.0": ("compile_error", "CompileError"),
    "1_softmax.0": ("numerical_mismatch", "values"),
    "1_sum_dim.0": ("shape_mismatch", "shape"),
}


def test_every_smoke_problem_has_a_reference_kernel_and_every_draft_an_intended_outcome():
    assert [p.stem for p in REFERENCE_KERNELS] == sorted(p.stem for p in SMOKE.glob("*.py"))
    assert sorted(p.stem for p in (KERNELS / "drafts").glob("*.py")) == sorted(DRAFT_OUTCOMES)


@pytest.mark.parametrize("kernel_path", REFERENCE_KERNELS, ids=lambda path: path.stem)
def test_reference_kernel_is_correct(kernel_path, config):
    problem = parse_problem(SMOKE / kernel_path.name)

    result = verify_candidate(problem, kernel_path.read_text(), config)

    assert result["outcome"] == "correct", result


@pytest.mark.parametrize(("draft", "expected"), DRAFT_OUTCOMES.items())
def test_draft_fails_as_intended(draft, expected, config):
    problem = parse_problem(SMOKE / f"{draft.split('.')[0]}.py")

    result = verify_candidate(problem, (KERNELS / "drafts" / f"{draft}.py").read_text(), config)

    assert (result["outcome"], result.get("error_class")) == expected, result


def test_speedups_divide_each_baseline_by_the_candidate_time():
    assert speedups({"runtime_ms": 2.0}, {"eager_ms": 4.0, "compile_ms": 3.0}) == {
        "speedup_eager": 2.0,
        "speedup_compile": 1.5,
        "speedup_best": 1.5,  # against the faster baseline
    }
    assert speedups({"runtime_ms": 2.0}, {"eager_ms": 1.0, "compile_ms": None}) == {
        "speedup_eager": 0.5,
        "speedup_compile": None,
        "speedup_best": 0.5,
    }
    no_runtime = {"speedup_eager": None, "speedup_compile": None, "speedup_best": None}
    assert speedups({"outcome": "timeout"}, {"eager_ms": 4.0, "compile_ms": 3.0}) == no_runtime
