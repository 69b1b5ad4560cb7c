"""The timing protocol on the CPU, and the check of the last timed call through the real worker."""

import time

import pytest
import torch

from tasks.harness.timing import Timing, TimingConfig, hidden_work_ms, remembered_ms, time_callable
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


class RememberingKernel:
    """Slow (5 ms) on the input sets in `always_slow` and, if it `remembers`, on a set it has not seen
    before; instant otherwise. Every call hands back the same buffer, holding the set's index."""

    def __init__(self, remembers: bool, always_slow: tuple[int, ...] = (), slow_from_call: int | None = None):
        self.input_sets_seen: list[int] = []
        self.remembers, self.always_slow, self.slow_from_call = remembers, always_slow, slow_from_call
        self.buffer = torch.zeros(1)

    def __call__(self, set_index: int) -> torch.Tensor:
        busy = self.slow_from_call is not None and len(self.input_sets_seen) >= self.slow_from_call
        if (self.remembers and set_index not in self.input_sets_seen) or set_index in self.always_slow or busy:
            time.sleep(0.005)
        self.input_sets_seen.append(set_index)
        return self.buffer.fill_(set_index)


@pytest.mark.parametrize(
    ("kernel", "remembered", "spare_timed"),
    [
        pytest.param(RememberingKernel(remembers=True), True, True, id="remembers-by-contents"),
        pytest.param(RememberingKernel(remembers=False, always_slow=(0, 1, 2, 3, 4)), False, False, id="honest-slow"),
        pytest.param(RememberingKernel(remembers=False, always_slow=(3,)), False, True, id="one-slow-unseen-run"),
        # 3 warm-up + 6 timed calls: from the last timed run on, every call is slow (a busy machine)
        pytest.param(RememberingKernel(remembers=False, slow_from_call=8), False, True, id="machine-busy-at-the-end"),
    ],
)
def test_outputs_remembered_by_input_contents_are_told_from_one_slow_run(kernel, remembered, spare_timed):
    config = TimingConfig(warmup_runs=3, min_runs=6, max_runs=6)

    timing = time_callable(kernel, [[0], [1], [2], [3]], CPU, config, spare=[4])

    assert (remembered_ms(timing) is not None) is remembered
    # the spare, after a seen set, only when the last run is suspect
    assert kernel.input_sets_seen[-2:] == ([0, 4] if spare_timed else [1, 3])
    assert len(timing.first_sight_ms) == (2 if spare_timed else 1)
    # the last timed output is set 3's, though the spare's run wrote into the same buffer after it
    assert timing.last_input_index == 3 and float(timing.last_output) == 3.0


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
