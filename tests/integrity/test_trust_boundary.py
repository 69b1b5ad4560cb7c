"""INTEGRITY.md rows 12-20: the candidate owns its process, so nothing it computes decides anything.

Each cheat here does what a candidate can do in its own process (frames, patched harness code,
threads, call counting, torch's global flags) and each asserts the exact result the orchestrator
reaches from what it saw itself; the honest twins must stay `correct`, also with every core busy.
The candidates skip the static pre-check on purpose (evaluate_in_worker runs the stages without it):
it is a first line, and these test what stands behind it. Row 13's file and process isolation is
in tests/tasks/harness/test_sandbox.py, rows 16 and 18 on a GPU in test_gpu_cheats.py.
"""

import subprocess
import sys
import time

import pytest

from tasks import drive
from tasks.judge import evaluate_in_worker
from tests.integrity.test_cheats import HONEST, RELU, RELU_BODY, SLOW_RELU_BODY, kernel_candidate

SLOW_RELU = kernel_candidate(SLOW_RELU_BODY + "\nreturn y")
TIMED_OUTPUT = ("integrity_violation", "timed_output")


def stages(problem: str, candidate: str, config) -> dict:
    """compile, verify and time in order, up to the first that does not pass; the last result."""
    for stage in ("compile", "verify", "time"):
        result = evaluate_in_worker(stage, problem, candidate, config)
        if result["outcome"] != "correct":
            return {**result, "stage": stage}
    return {**result, "stage": "time"}


def forged_clock(slow: int) -> str:
    return kernel_candidate(
        SLOW_RELU_BODY + "\nreturn y",
        prelude=f"""
        import sys, time
        session = sys.modules["tasks.harness.session"]
        _real = time.perf_counter
        session._clock = lambda: _real() / {slow}
        sys.modules["tasks.harness.guard"].patched = lambda bindings: []
        """,
    )


def test_on_the_cpu_a_refuted_stage_is_timed_again_and_a_forgery_stays_refuted(config):
    """A refuted cpu stage gets a fresh pair (an honest pair's placement can refute it once): the
    half-speed forged clock is refuted on both, and the second stage's floor is the time kept."""
    from types import SimpleNamespace

    from tasks.measure import time_candidate

    result = time_candidate(SimpleNamespace(source=RELU), forged_clock(2), config)
    assert result["outcome"] == "correct", result
    assert result["retimed_from"] in ("observed", "cpu"), result
    assert result["timing_source"] in ("observed", "cpu"), result
    assert result["runtime_ms"] > 1.2 * result["claimed_ms"], result


@pytest.mark.parametrize("slow", [100, 2], ids=["100x", "half-speed"])
def test_row12_a_forged_clock_behind_a_blinded_guard_gains_nothing(config, slow):
    """The harness clock in the worker is replaced by one that runs `slow` times slow, and the guard
    that would notice is replaced by one that never does (what C++ running Python can do after the
    guard has looked): the claims are that much too small, the orchestrator's clock is not. The
    half-speed clock is the modest forgery that a pairs' test over this config's few calls missed."""
    forged = forged_clock(slow)
    honest = stages(RELU, SLOW_RELU, config)
    cheat = stages(RELU, forged, config)
    assert honest["outcome"] == cheat["outcome"] == "correct", (honest, cheat)
    assert cheat["claimed_ms"] < honest["runtime_ms"] / (20 if slow == 100 else 1.2), cheat  # really forged
    assert cheat["timing_source"] in ("observed", "cpu"), cheat  # a floor of the orchestrator's, not the claims
    # not below the honest kernel's CPU time over the worker's threads, which a busy machine does not move
    assert cheat["runtime_ms"] > 0.8 * honest["cpu_floor_ms"], (cheat, honest)


# The harness's own call step replaced (and the guard blinded): past the first five calls, each
# call's reply goes out at once and a persistent thread computes the output afterwards.
REPLIES_EARLY = kernel_candidate(
    SLOW_RELU_BODY + "\nreturn y",
    prelude="""
    import queue, sys, threading
    session = sys.modules["tasks.harness.session"]
    sys.modules["tasks.harness.guard"].patched = lambda bindings: []
    honest_call, calls, pending = session._call, [0], queue.Queue()

    def compute():
        while True:
            model, inputs, target = pending.get()
            target.copy_(model(*inputs))

    threading.Thread(target=compute, daemon=True).start()

    def early(step, model, device, state, bindings, classify):
        calls[0] += 1
        if model is state.get("echo_model") or calls[0] <= 5:
            return honest_call(step, model, device, state, bindings, classify)
        pending.put((model, [None if t is None else t.clone() for t in state["inputs"]], state["outputs"][0]))
        return {"claimed_ms": 0.001, "ops": [] if step.get("record") else None}

    session._call = early
    """,
)


# The same, with a new thread per call that ends once the output is done: its CPU time leaves the
# live threads' counters, and the process's own counters keep it.
REPLIES_EARLY_SHORT_THREADS = REPLIES_EARLY.replace(
    'pending.put((model, [None if t is None else t.clone() for t in state["inputs"]], state["outputs"][0]))',
    'job = (model, [None if t is None else t.clone() for t in state["inputs"]], state["outputs"][0])\n'
    "    threading.Thread(target=lambda: job[2].copy_(job[0](*job[1]))).start()",
)


@pytest.mark.parametrize("cheat", [REPLIES_EARLY, REPLIES_EARLY_SHORT_THREADS], ids=["persistent", "per-call"])
def test_row17_replying_before_the_output_is_done_gains_nothing(config, cheat):
    """Caught on a judged call or between calls, or, when a busy machine delays this process past the
    thread's work, timed by the worker's CPU time from call to call, which the late work is in."""
    assert cheat != REPLIES_EARLY or "pending.put" in cheat
    honest = stages(RELU, SLOW_RELU, config)
    result = stages(RELU, cheat, config)
    assert honest["outcome"] == "correct", honest
    if result["outcome"] == "correct":  # not below the honest kernel's CPU floor, which load does not move
        assert result["timing_source"] != "claimed", result
        assert result["runtime_ms"] > 0.8 * honest["cpu_floor_ms"], (result, honest)
    else:
        assert result["stage"] == "time" and result["outcome"] == "integrity_violation", result
        assert result["error_class"] in ("timed_output", "busy_between_calls"), result


def test_row14_computing_only_on_the_first_calls_is_caught_on_a_timed_call(config):
    """Verify makes a few calls; a candidate that computes for its first four calls and returns
    garbage after them passes verify and is caught on the timed calls the orchestrator judges."""
    counting = kernel_candidate(
        "self.calls += 1\nif self.calls > 4:\n    return torch.zeros_like(x)\n" + RELU_BODY, init="    self.calls = 0"
    )
    result = stages(RELU, counting, config)
    assert (result["stage"], result["outcome"], result["error_class"]) == ("time", *TIMED_OUTPUT)
    assert "the output of timed call" in result["error_excerpt"]


def test_row14_computing_only_when_torch_flags_say_it_is_watched_is_caught(config):
    """The attack that told verify from timing by torch's deterministic mode: the flags now differ
    only on the few calls the orchestrator watches, and it judges unwatched timed calls too."""
    flagged = kernel_candidate(
        "if not torch.are_deterministic_algorithms_enabled():\n    return torch.zeros_like(x)\n" + RELU_BODY
    )
    result = stages(RELU, flagged, config)
    assert (result["stage"], result["outcome"], result.get("error_class")) == ("time", *TIMED_OUTPUT), result


def test_row17_a_thread_that_works_between_calls_is_caught(config):
    """A persistent thread that computes while the orchestrator prepares the next call."""
    threaded = kernel_candidate(
        RELU_BODY,
        init="""
    import threading
    def work():
        while True:
            sum(range(10000))
    threading.Thread(target=work, daemon=True).start()
""",
    )
    result = stages(RELU, threaded, config)
    assert (result["outcome"], result["error_class"]) == ("integrity_violation", "busy_between_calls"), result
    assert result["stage"] in ("verify", "time")  # verify watches every gap, but its few may add up to little


def test_row17_slowing_the_paired_reference_between_calls_gains_nothing(config):
    """Past verify's few calls, each call leaves a thread spinning for 20 ms after forward returns,
    while the orchestrator times the paired reference beside it: the reference's eager time would
    grow, and the speedup with it. The spin lands in the candidate's own CPU-time floor (its next
    calls share the cores with it), or in `busy_between_calls`. Measured on this 2-core machine
    under a stressed CI run: the pair's eager time went from 0.38 to 0.67 ms, the candidate's own
    from 0.48 to 21.2 ms."""
    spinning = kernel_candidate(
        """
y = torch.empty_like(x)
lib.relu(x, y, x.numel())
self.calls += 1
if self.calls > 8:
    import threading, time
    def spin(until=time.perf_counter() + 0.02):
        while time.perf_counter() < until:
            pass
    threading.Thread(target=spin, daemon=True).start()
return y
""",
        init="    self.calls = 0",
    )
    many_calls = config.model_copy(update={"max_timed_runs": 30, "timing_budget_s": 1.0, "paired_reference": True})
    honest = stages(RELU, kernel_candidate(RELU_BODY), many_calls)
    result = stages(RELU, spinning, many_calls)
    assert honest["outcome"] == "correct", honest
    if result["outcome"] == "correct":
        speedup = result["paired_eager_ms"] / result["runtime_ms"]
        assert speedup < honest["paired_eager_ms"] / honest["runtime_ms"], (result, honest)
    else:
        assert (result["outcome"], result["error_class"]) == ("integrity_violation", "busy_between_calls"), result


def test_row17_its_honest_twin_with_an_idle_thread_is_correct(config):
    idle = kernel_candidate(
        RELU_BODY,
        init="""
    import threading, time
    threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
""",
    )
    assert stages(RELU, idle, config)["outcome"] == "correct"


def test_row17_output_finished_by_a_thread_after_forward_returns_is_caught(config):
    late = kernel_candidate(
        """
        import threading, time
        y = torch.empty_like(x)
        def finish():
            time.sleep(0.05)
            lib.relu(x, y, x.numel())
        threading.Thread(target=finish).start()
        return y
        """
    )
    result = stages(RELU, late, config)
    assert result["stage"] == "verify" and result["outcome"] in ("numerical_mismatch", "integrity_violation"), result


def test_row18_a_library_op_called_from_a_helper_thread_is_seen(config):
    """The reference's op, run on a thread of the candidate's own: a thread-local dispatch hook does
    not see it; the recording of watched calls covers every thread of the process."""
    helper = kernel_candidate(
        """
        import threading
        out = {}
        worker = threading.Thread(target=lambda: out.setdefault("y", torch.relu(x)))
        worker.start()
        worker.join()
        return out["y"]
        """
    )
    result = stages(RELU, helper, config)
    assert (result["stage"], result["outcome"], result["error_class"]) == (
        "verify",
        "integrity_violation",
        "reference_op",
    )
    assert "aten::relu" in result["error_excerpt"]


def test_row19_a_time_below_writing_the_outputs_is_impossible():
    """However the time came about, one shorter than writing the outputs at the device's peak
    bandwidth is refused (the orchestrator's floor makes it unreachable for a session)."""
    runtime = drive.trusted.runtime_for(RELU, "cpu", None, 0)
    with pytest.raises(drive.Stop) as stop:
        drive._roofline(runtime, 1e-9)
    assert (stop.value.outcome["outcome"], stop.value.outcome["error_class"]) == (
        "integrity_violation",
        "impossible_speed",
    )
    assert drive._roofline(runtime, 10.0)["roofline_fraction"] > 0
    assert drive._roofline(runtime, 10.0)["min_bytes"] == runtime.input_bytes + runtime.output_bytes > 0


def test_timing_keeps_claims_the_observation_bears_out():
    calls = [drive.Call(0, claimed_ms=1.0, observed_ms=1.3, ops=None, inputs=[]) for _ in range(9)]
    kept = drive.summarize(calls, echo_ms=0.4)
    assert (kept["median_ms"], kept["timing_source"]) == (1.0, "claimed")
    forged = [drive.Call(0, claimed_ms=0.01, observed_ms=1.3, ops=None, inputs=[]) for _ in range(9)]
    floor = drive.summarize(forged, echo_ms=0.4)
    assert floor["timing_source"] == "observed" and floor["median_ms"] == pytest.approx(0.9)
    # a busy machine: the wall-clock floor says little, the CPU time from call to call still counts
    delayed = [drive.Call(0, claimed_ms=0.01, observed_ms=5.0, ops=None, inputs=[], cpu_ms=2.2) for _ in range(9)]
    by_cpu = drive.summarize(delayed, echo_ms=4.9, echo_cpu_ms=0.2, threads=2)
    assert by_cpu["timing_source"] == "cpu" and by_cpu["median_ms"] == pytest.approx(1.0)


def pairs_of(n: int, claimed: float, true_ms: float, jitter_ms: float, seed: int = 7) -> tuple[list, list]:
    """n ABBA pairs, candidate and reference: the reference's claim is its true time; both calls of a
    pair see their own round trip of 0.7 ms plus host jitter of up to `jitter_ms`."""
    import random

    rng = random.Random(seed)
    candidate, reference = [], []
    for _ in range(n):
        candidate.append(drive.Call(0, claimed, 0.7 + true_ms + rng.uniform(0, jitter_ms), None, []))
        reference.append(drive.Call(0, 0.05, 0.7 + 0.05 + rng.uniform(0, jitter_ms), None, []))
    return candidate, reference


def test_on_a_gpu_every_stage_takes_the_same_output_copy():
    """The copy a GPU call's clock waits for is in every round trip: dd44939 left it out of the
    paired reference's (identity candidates on 4 GB outputs refuted, 0.48x), and the baselines' was
    missing until a candidate without a partner, whose floor is the baseline's, got 0.49x on 6.4 GB."""
    for stage in ("verify", "time", "paired", "baseline", drive.COMPILED_BASELINE):
        assert drive.copies_outputs("cuda", stage), stage
    assert not drive.copies_outputs("cpu", "time")  # the cpu's buffers are read where the worker left them


def test_paired_claims_stand_on_a_busy_host_and_fall_when_forged():
    # An identity kernel of 50 us on a host whose round trips jitter by up to 0.5 ms: its claims stand,
    # where the unpaired rule (floor = observed less the median echo) gives up to 10x its true time.
    honest, reference = pairs_of(60, claimed=0.05, true_ms=0.05, jitter_ms=0.5)
    assert drive.paired_source(honest, reference) == "claimed"
    # The same kernel claiming 5 us (a forged clock) against 50 us of work on a quiet host: refuted.
    forged, reference = pairs_of(60, claimed=0.005, true_ms=0.05, jitter_ms=0.01)
    assert drive.paired_source(forged, reference) == "observed"
    # A kernel of 1 ms claiming 0.1 ms on the busy host: the forgery is far beyond the pairs' spread.
    forged, reference = pairs_of(60, claimed=0.1, true_ms=1.0, jitter_ms=0.5)
    assert drive.paired_source(forged, reference) == "observed"
    # Five pairs on a very noisy host claiming nothing for 0.7 ms of work: too few for the pairs' test,
    # not for the backstop (the floor's median, less the empty call's 0.7 ms, against twice the claims).
    few, reference = pairs_of(5, claimed=0.001, true_ms=0.7, jitter_ms=3.0, seed=3)
    assert drive.paired_source(few, reference, echo_ms=0.7) == "observed"
    # CPU time that refutes a claim the wall clock cannot (a delayed, busy worker): "cpu".
    for call, ref in zip(forged, reference):
        call.cpu_ms, ref.cpu_ms = 4.0, 0.1
        call.observed_ms = ref.observed_ms + (call.claimed_ms - ref.claimed_ms)  # the wall floor agrees
    assert drive.paired_source(forged, reference) == "cpu"


@pytest.fixture
def busy_cores():
    """Every core busy with a spinning process for the test (at most 10 minutes)."""
    spin = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"
    import os

    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
    time.sleep(0.5)
    yield
    for spinner in spinners:
        spinner.kill()
        spinner.wait()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relu", "relu-fifty-times-over", "scale-copies"])
def test_row20_honest_twins_stay_correct_with_every_core_busy(name, config, busy_cores):
    problem, candidate = HONEST[name]
    result = stages(problem, candidate, config)
    assert result["outcome"] == "correct", result


def test_the_pair_decides_the_eager_time_unless_it_was_slowed_beyond_both_spreads():
    from tasks.measure import eager_time

    baseline = {"eager_ms": 0.100, "eager_p10_ms": 0.095, "eager_p90_ms": 0.115, "eager_observed_ms": 0.4}
    # Two workers on two cores: the pair runs 12% slower than the baseline had it alone, within the spreads.
    contended = {"timing_source": "claimed", "paired_eager_ms": 0.112, "paired_eager_p10_ms": 0.104}
    assert eager_time(contended, baseline) == (0.112, "paired")
    # A candidate that slows its pair (GPU work left running, a thread): every pair call slower than the
    # baseline's slowest tenth, so the baseline stage's time stands.
    slowed = {"timing_source": "claimed", "paired_eager_ms": 0.180, "paired_eager_p10_ms": 0.160}
    assert eager_time(slowed, baseline) == (0.100, "baseline")
    # Timed by the orchestrator's floor: compared with the baseline's same floor, no spread recorded for it.
    assert eager_time({"timing_source": "observed", "paired_eager_ms": 0.5}, baseline) == (0.5, "paired")
    assert eager_time({"timing_source": "observed", "paired_eager_ms": 0.9}, baseline) == (0.4, "baseline")
    assert eager_time({"timing_source": "claimed"}, baseline) == (0.100, "baseline")  # no pair


def test_a_watched_call_whose_device_work_outlasts_its_events_is_a_side_stream():
    """The orchestrator's half of the side-stream check (the GPU half: tests/integrity/test_gpu_cheats.py):
    device work starting before the current stream reached forward, or ending after it passed
    forward's end, is work on a stream not ordered with it."""
    from kforge.config import RunConfig

    config = RunConfig(backend="cuda", allow_library_calls=True)
    within = drive.Call(seed=1, claimed_ms=0.05, observed_ms=0.2, ops=[], inputs=[], device_overrun_ms=0.0)
    drive._check_ops(None, within, config)
    outlasting = drive.Call(seed=1, claimed_ms=0.0013, observed_ms=0.2, ops=[], inputs=[], device_overrun_ms=0.021)
    with pytest.raises(drive.Stop) as stopped:
        drive._check_ops(None, outlasting, config)
    outcome = stopped.value.outcome
    assert (outcome["outcome"], outcome["error_class"]) == ("integrity_violation", "side_stream"), outcome
    assert "(0.0210 ms outside it)" in outcome["error_excerpt"], outcome
