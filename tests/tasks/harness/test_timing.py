"""The timing protocol on the CPU, and the check of the last timed call through the real worker."""

import time

import pytest
import torch

from tasks.harness.timing import Timing, TimingConfig, hidden_work_ms, time_callable
from tasks.judge import evaluate_in_worker

CPU = torch.device("cpu")


class SleepingKernel:
    """Sleeps 2 ms per call and records which input set each call got."""

    def __init__(self):
        self.input_sets_seen: list[int] = []

    def __call__(self, set_index: int) -> tuple[str, int, int]:
        self.input_sets_seen.append(set_index)
        time.sleep(0.002)
        return ("output", set_index, len(self.input_sets_seen))


def test_sleeping_function_times_at_two_milliseconds_over_rotating_inputs():
    kernel = SleepingKernel()
    config = TimingConfig(warmup_runs=2, min_runs=5, max_runs=40, budget_s=0.03)

    timing = time_callable(kernel, [[0], [1], [2], [3]], CPU, config)

    assert 1.9 <= timing.p10_ms <= 4.0  # p10: a busy machine delays some wake-ups, never all of them
    assert timing.p10_ms <= timing.median_ms <= timing.p90_ms
    assert config.min_runs <= timing.runs < config.max_runs  # the budget, not the cap, ended it
    warmup, timed = kernel.input_sets_seen[:2], kernel.input_sets_seen[2:]
    assert warmup == [0, 1]
    # Sets 0-2 rotate; set 3 is kept for the last timed run, so no earlier call has seen its inputs.
    assert timed == [run % 3 for run in range(timing.runs - 1)] + [3]
    assert timing.last_input_index == 3
    assert timing.last_output == ("output", 3, len(kernel.input_sets_seen))


@pytest.mark.parametrize(("budget_s", "expected_runs"), [(1e-9, 4), (60.0, 7)])
def test_run_count_stays_between_min_and_max(budget_s, expected_runs):
    kernel = SleepingKernel()
    config = TimingConfig(warmup_runs=0, min_runs=4, max_runs=7, budget_s=budget_s)

    timing = time_callable(kernel, [[0], [1]], CPU, config)

    assert timing.runs == expected_runs == len(kernel.input_sets_seen)


PROBLEM = '''
"""y = 2x on 4096 floats."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(4096)]


def get_init_inputs():
    return []
'''

# Right for its first five calls, garbage afterwards: verification (two calls) cannot see it,
# only a check of the last timed call can (INTEGRITY.md row 3).
GOES_BAD_AFTER_FIVE_CALLS = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 5:
            return torch.zeros_like(x)
        return x * 2
"""

HONEST = PROBLEM.replace("class Model(", "class ModelNew(")


def test_last_timed_output_catches_a_candidate_that_goes_bad_after_verification(config):
    config = config.model_copy(update={"allow_library_calls": True})  # y = x * 2 in torch, as the reference
    assert config.correctness_trials <= 5 < config.warmup_runs + config.min_timed_runs
    verified = evaluate_in_worker("verify", PROBLEM, GOES_BAD_AFTER_FIVE_CALLS, config)
    assert verified["outcome"] == "correct", verified

    timed = evaluate_in_worker("time", PROBLEM, GOES_BAD_AFTER_FIVE_CALLS, config)

    assert (timed["outcome"], timed["error_class"]) == ("integrity_violation", "last_timed_output")
    assert timed["error_excerpt"].startswith("the output of the last timed call is wrong: output 0:")


def test_honest_candidate_is_timed_within_the_run_limits(config):
    timed = evaluate_in_worker("time", PROBLEM, HONEST, config)

    assert timed["outcome"] == "correct", timed
    assert 0 < timed["runtime_p10_ms"] <= timed["runtime_ms"] <= timed["runtime_p90_ms"]
    assert config.min_timed_runs <= timed["timed_runs"] <= config.max_timed_runs


@pytest.mark.parametrize(
    ("median_ms", "sync_gap_ms", "hidden"),
    [
        (0.05, 0.0, None),  # honest: the host latency is already taken off
        (0.05, 0.02, None),  # within noise
        (0.005, 0.06, None),  # 60 us after a 5 us window: within the host noise of an H100 host
        (0.005, 0.15, 0.15),  # a 150 us kernel hidden behind a 5 us window
        (5.0, 2.0, None),  # a long kernel with some host-side tail: under half its runtime
        (1.0, 4.0, 4.0),  # most of the work after the timed stream finished
    ],
)
def test_work_after_the_timed_stream_counts_as_hidden_only_when_large(median_ms, sync_gap_ms, hidden):
    timing = Timing(median_ms, median_ms, median_ms, 10, None, 0, sync_gap_ms=sync_gap_ms)
    assert hidden_work_ms(timing) == hidden
