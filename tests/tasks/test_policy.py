"""The iteration policy between a problem's attempts (tasks/policy.py)."""

from tasks.generate import GenerationReply
from tasks.policy import after_attempt, broken_reference


def test_a_problem_whose_reference_fails_is_skipped_with_its_error():
    assert broken_reference("1_relu", {"outcome": "correct", "eager_ms": 1.0}) is None
    reason = broken_reference("1_relu", {"outcome": "runtime_error", "error_excerpt": "ZeroDivisionError"})
    assert reason.startswith("1_relu: the reference itself fails") and "ZeroDivisionError" in reason


def test_the_next_iteration_gets_the_kernel_its_outcome_and_the_recommendation():
    row = {"iteration": 0, "outcome": "numerical_mismatch", "error_excerpt": "trial 0: 3 of 16 elements"}
    step = after_attempt(GenerationReply("class ModelNew: ..."), row, "fuse the two loops")
    assert step.previous_source == "class ModelNew: ..."
    assert (step.feedback["outcome"], step.feedback["error_excerpt"]) == ("numerical_mismatch", row["error_excerpt"])
    assert step.recommendation == "fuse the two loops" and not step.stop
    assert after_attempt(GenerationReply("x", exhausted=True), row, None).stop


def test_a_reference_over_its_workers_memory_limit_is_not_called_broken():
    """KernelBench's 2_ShallowWideMLP (8.6 GB of weights) was killed at 8252 MB resident in its
    baseline on an H200 and reported as a failing reference."""
    baseline = {
        "outcome": "runtime_error",
        "error_class": "out_of_memory",
        "error_excerpt": "killed at 8252 MB resident, over the limit of 8192 MB",
    }
    reason = broken_reference("2_ShallowWideMLP", baseline)
    assert "the reference itself fails" not in reason
    assert "memory_limit_mb" in reason and "8252 MB resident" in reason
