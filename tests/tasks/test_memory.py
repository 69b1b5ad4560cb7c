"""The memory planner on hand-made problem sizes, and the harness's out-of-memory outcome."""

from __future__ import annotations

import pytest
import torch

from tasks import memory
from tasks.drive import HARNESS_OUT_OF_MEMORY, harness_out_of_memory
from tasks.isolate import InfrastructureError
from tasks.judge import evaluate_in_worker

GB = 10**9
RELU_TENSOR = 4096 * 393216 * 4  # KernelBench level 1, 19_ReLU: 6.4 GB in, 6.4 GB out


def test_a_small_problem_keeps_everything_on_the_device_with_its_pair():
    plan = memory.plan(16 << 20, 16 << 20, 1 << 20, budget_bytes=100 * GB, paired=True)

    assert not plan.samples_on_host and plan.paired
    assert plan.stage_bytes == memory.stage_bytes(16 << 20, 16 << 20, 1 << 20, False, True)


@pytest.mark.parametrize(
    ("budget_gb", "samples_on_host", "paired"),
    [(120, False, True), (100, True, True), (80, True, False)],
)
def test_a_six_gigabyte_problem_gives_up_resident_copies_as_the_budget_shrinks(budget_gb, samples_on_host, paired):
    plan = memory.plan(RELU_TENSOR, RELU_TENSOR, 0, budget_bytes=budget_gb * GB, paired=True)

    assert (plan.samples_on_host, plan.paired) == (samples_on_host, paired)
    assert plan.stage_bytes <= budget_gb * GB


def test_a_problem_that_fits_no_plan_gets_the_leanest_one_and_says_so():
    plan = memory.plan(RELU_TENSOR, RELU_TENSOR, 0, budget_bytes=10 * GB, paired=True)

    assert plan.samples_on_host and not plan.paired
    assert plan.stage_bytes > 10 * GB
    described = plan.describe()
    assert "inputs 6.00 GiB" in described and "a budget of 9.31 GiB" in described


def test_without_a_device_nothing_is_planned_away():
    plan = memory.plan(RELU_TENSOR, RELU_TENSOR, 0, budget_bytes=None, paired=True)

    assert not plan.samples_on_host and plan.paired and "no budget" in plan.describe()


def test_the_out_of_memory_outcome_names_the_bytes_and_the_budget():
    plan = memory.plan(RELU_TENSOR, RELU_TENSOR, 0, budget_bytes=10 * GB, paired=True)
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has 2.1 GiB free")

    outcome = harness_out_of_memory("time", error, plan)

    assert memory.is_out_of_memory(error)
    assert (outcome["outcome"], outcome["error_class"]) == ("runtime_error", HARNESS_OUT_OF_MEMORY)
    assert "Tried to allocate 6.00 GiB" in outcome["error_excerpt"]
    assert "a budget of 9.31 GiB" in outcome["error_excerpt"] and "time stage" in outcome["error_excerpt"]


OUT_OF_MEMORY_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")


def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_running_out_of_memory_making_inputs_is_an_infrastructure_failure_not_a_broken_reference(config):
    """The stage's task retries an InfrastructureError (a broken reference would skip the problem)."""
    with pytest.raises(InfrastructureError, match="ran out of device memory in the baseline stage") as raised:
        evaluate_in_worker("baseline", OUT_OF_MEMORY_PROBLEM, None, config)
    assert "also when retried alone on the host" in str(raised.value)


OUT_OF_MEMORY_UNLESS_ALONE = OUT_OF_MEMORY_PROBLEM.replace(
    """def get_inputs():
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")""",
    """def get_inputs():
    # made by the orchestrator: out of memory while other stages share the host, as when their models hold it
    from tasks import slots

    if not slots.holding_alone():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")
    return [torch.randn(64)]""",
)


@pytest.mark.slow
def test_a_stage_that_ran_out_of_memory_is_retried_alone_on_the_host(config):
    assert OUT_OF_MEMORY_UNLESS_ALONE != OUT_OF_MEMORY_PROBLEM
    result = evaluate_in_worker("baseline", OUT_OF_MEMORY_UNLESS_ALONE, None, config)
    assert result["outcome"] == "correct" and result["eager_ms"] > 0, result


def test_alone_on_the_host_waits_for_every_stage_and_holds_new_ones_back():
    """A GPU backend's compile stages share the host too; a stage retried alone waits for them,
    a stage that starts meanwhile waits for it, and inside it the stage's own slots do not block."""
    import threading
    import time

    from tasks import slots

    order = []
    compiling, release = threading.Event(), threading.Event()

    def compile_stage():
        with slots.device_slot("cuda", "compile"):
            compiling.set()
            release.wait(10)
            order.append("compile ends")

    def later_stage():
        with slots.device_slot("cuda", "verify"):
            order.append("later stage")

    def retried_alone():
        with slots.alone_on_host("cuda"):
            order.append("alone starts")
            with slots.device_slot("cuda", "time"):  # its own stage's slots, inside
                time.sleep(0.2)
            order.append("alone ends")

    first = threading.Thread(target=compile_stage)
    first.start()
    compiling.wait(10)
    alone = threading.Thread(target=retried_alone)
    alone.start()
    time.sleep(0.2)
    later = threading.Thread(target=later_stage)
    later.start()
    time.sleep(0.2)
    assert order == []  # the retry waits for the compile, the later stage for the retry
    release.set()
    for thread in (first, alone, later):
        thread.join(10)
    assert order == ["compile ends", "alone starts", "alone ends", "later stage"]


def _admit_all(sizes: list[int], budget: int, hold_s: float = 0.15) -> tuple[list[int], list[int], list[str]]:
    """Every size reserved from one ByteBudget by a thread of its own, started in order; returns the
    bytes and reservations held at each grant and the order the reservations ended."""
    import threading
    import time

    from tasks import slots

    admission = slots.ByteBudget()
    peaks, holders, ended, waited = [], [], [], []
    lock = threading.Lock()

    def problem(index: int, size: int) -> None:
        with admission.reserve(size, budget, on_wait=lambda *_: waited.append(index)):
            with lock:
                reserved, held = admission.reserved()
                peaks.append(reserved)
                holders.append(held)
            time.sleep(hold_s)
        with lock:
            ended.append(index)

    threads = [threading.Thread(target=problem, args=(i, size)) for i, size in enumerate(sizes)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)  # in order: the queue is first come, first served
    for thread in threads:
        thread.join(timeout=30)
    assert all(not t.is_alive() for t in threads)
    return peaks, holders, [f"{i}" for i in ended] + [f"w{i}" for i in waited]


def test_problems_are_admitted_to_the_device_by_their_planned_memory():
    # KernelBench-like plans on a 100 GB budget: three 6.4 GB-per-tensor stages (40 GB each) and small ones
    big, small = 40 * GB, 1 * GB
    peaks, holders, order = _admit_all([big, big, big, small, small], budget=100 * GB)

    assert max(peaks) <= 100 * GB  # never more planned at once than the budget
    assert max(holders) >= 2  # but not one at a time either
    assert "w2" in order and "w0" not in order  # the third big one waited for room


def test_a_problem_planned_beyond_the_whole_budget_runs_alone_and_does_not_block_the_run():
    peaks, holders, order = _admit_all([GB, 150 * GB, GB], budget=100 * GB)

    assert sorted(i for i in order if not i.startswith("w")) == ["0", "1", "2"]
    grant_of_big = peaks.index(150 * GB)
    assert holders[grant_of_big] == 1  # alone on the device
    assert order.index("0") < order.index("2")  # first come, first served: the last one waited its turn


def test_a_problem_waiting_for_device_memory_gives_up_when_kforge_stops_and_leaves_the_queue():
    import threading

    from tasks import isolate, slots

    budget = slots.ByteBudget()
    outcome = []

    def waiter():
        try:
            with budget.reserve(60 * GB, 100 * GB, check_stop=isolate.check_stopping):
                outcome.append("granted")
        except isolate.Stopping:
            outcome.append("stopped")

    with budget.reserve(60 * GB, 100 * GB):  # a problem in flight holds most of the device
        thread = threading.Thread(target=waiter)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive() and outcome == []  # it waits for room
        isolate._stopping.set()  # what stop_workers() does on SIGTERM
        try:
            thread.join(5 * slots.STOP_POLL_S)
        finally:
            isolate.resume_workers()
        assert not thread.is_alive() and outcome == ["stopped"]  # while the holder still holds
    with budget.reserve(60 * GB, 100 * GB):  # the queue holds no dead ticket: the next one is granted
        assert budget.reserved() == (60 * GB, 1)


BIG_WEIGHTS_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("weights", torch.zeros(16 << 20))  # 64 MiB

    def forward(self, x):
        return x + self.weights[: x.numel()].view_as(x)

def get_inputs():
    return [torch.randn(64)]

def get_init_inputs():
    return []
"""


def test_a_workers_memory_limit_makes_room_for_two_copies_of_the_problems_weights(config):
    """The limit a stage's worker gets is the setting plus twice the reference's parameter and
    buffer bytes: known before any worker starts (the Model built on torch's meta device, as a
    compile stage on a GPU needs it), and as built once this process has built the reference."""
    from tasks import drive, trusted

    before = drive._limits("compile", config, BIG_WEIGHTS_PROBLEM)
    gpu = config.model_copy(update={"backend": "cuda"})
    assert drive._limits("compile", gpu, BIG_WEIGHTS_PROBLEM).resident_mb == config.memory_limit_mb + 128
    result = evaluate_in_worker("baseline", BIG_WEIGHTS_PROBLEM, None, config)
    assert result["outcome"] == "correct", result
    after = drive._limits("verify", config, BIG_WEIGHTS_PROBLEM)

    assert trusted.known_parameter_bytes(BIG_WEIGHTS_PROBLEM, "cpu", None) == 64 << 20
    assert (before.memory_mb, after.memory_mb) == (config.memory_limit_mb + 128,) * 2
    # a Model that cannot be built on the meta device (its __init__ reads a value) is not estimated
    buffer = 'self.register_buffer("weights", torch.zeros(16 << 20))  # 64 MiB'
    reads_a_value = BIG_WEIGHTS_PROBLEM.replace(buffer, f"{buffer}\n        self.scale = float(self.weights.sum())")
    assert reads_a_value != BIG_WEIGHTS_PROBLEM
    assert trusted.known_parameter_bytes(reads_a_value, "cpu", None) is None
    assert drive._limits("compile", config, reads_a_value).memory_mb == config.memory_limit_mb
