"""The timing protocol, written once for the candidate and both baselines.

Warm up, then time each run alone: synchronize the whole device, flush the last-level cache,
start the clock, run, stop the clock. Inputs rotate over several sets drawn from seeds the
candidate never saw. Reported: median, p10 and p90 in milliseconds, and the number of runs.

On CUDA the clock is a pair of events on the current stream. Between the flush and the start
event the GPU spins for a fixed number of cycles, so it is still busy while the host launches the
run: the window holds the GPU's work, not the host's launch latency (without the spin, about
50 us of host time sat inside every window, 30 % run-to-run spread for a 50 us kernel).
Work on a side stream would escape those events (INTEGRITY.md row 2), so each run also records a
third event after a device-wide synchronize: `sync_gap_ms`, the median of (synchronized end -
stream end) less the same gap measured on an empty call (the host's own latency), is about zero
for an honest kernel and the side stream's work for one that hides it.
Elsewhere the clock is `time.perf_counter` around run + synchronize.

Every run reads the same input tensors, refilled before it (outside the window) with the next of
the rotating input sets: a candidate that remembers its output by input pointer or shape
(INTEGRITY.md row 3) hands back the previous run's result, which the check of the last timed output
catches. One that remembers it by the inputs' contents hands back right results, fast, for the
rotating sets, and is slow on the last set, which it has never seen: a spare unseen set confirms
it (`remembered_ms`).
The clock functions are bound here, at import, before any candidate module exists, so a candidate
that replaces `time.perf_counter` or `torch.cuda.Event.elapsed_time` changes nothing this module
calls (INTEGRITY.md row 9; the worker also refuses such a candidate, see harness/guard.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tasks.harness.modules import synchronize

_clock = time.perf_counter
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_event_synchronize = torch.cuda.Event.synchronize
_device_synchronize = torch.cuda.synchronize
_spin = torch.cuda._sleep

# Bigger than the last-level cache of the CPUs and GPUs we run on (H100 L2 is 50 MB).
FLUSH_BYTES = 64 * 1024 * 1024
# GPU cycles spun before the start event: about 150 us at H100 clocks, longer than the host needs
# to launch even a Python-heavy forward of a few ops, so the GPU never idles inside the window.
LAUNCH_COVER_CYCLES = 300_000
# An honest kernel's gap, host latency taken off, reached 0.054 ms on an H100 host running other
# workers beside it: below this, hidden work cannot be told from the host's own noise.
SIDE_STREAM_MIN_GAP_MS = 0.1
# A run on inputs no earlier call has seen is suspect when it takes this much longer than the runs
# on the rotating sets (both bounds): a candidate that remembers outputs by their inputs' contents
# is fast on inputs it has seen and slow, because it really computes, on new ones.
REMEMBERED_FACTOR = 3.0
REMEMBERED_MIN_GAP_MS = 0.05


@dataclass
class TimingConfig:
    warmup_runs: int = 3
    min_runs: int = 10
    max_runs: int = 100
    budget_s: float = 1.0  # stop after min_runs once this much time has been spent timing


@dataclass
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int
    last_output: Any
    last_input_index: int
    sync_gap_ms: float = 0.0  # CUDA: device-wide end minus stream end (median); see the module docstring
    seen_median_ms: float | None = None  # median of the runs on the rotating (already seen) sets
    first_sight_ms: tuple[float, ...] = ()  # runs on unseen sets: the last timed one, and the spare's if run
    seen_recheck_ms: float | None = None  # a run on a seen set just before the spare's


def _percentile(sorted_values: list[float], fraction: float) -> float:
    position = fraction * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def time_callable(
    fn: Callable[..., Any],
    input_sets: list[list[Any]],
    device: torch.device,
    config: TimingConfig,
    spare: list[Any] | None = None,
) -> Timing:
    """Time `fn(*inputs)` with the protocol above: warm-up and timed runs rotate over all but the last
    of `input_sets`; the last timed run gets the last set, which no earlier call has seen, and its
    output is `last_output` (a candidate that replays an earlier result cannot pass that check).
    When that run is suspect (REMEMBERED_FACTOR), one more run on `spare`, also unseen, is timed:
    see `remembered_ms`."""
    rotation = input_sets[:-1] if len(input_sets) > 1 else input_sets
    flush_buffer = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    live_inputs = [v.clone() if isinstance(v, torch.Tensor) else v for v in input_sets[0]]
    output = None
    with torch.no_grad():
        for run in range(config.warmup_runs):
            _refill(live_inputs, rotation[run % len(rotation)])
            output = fn(*live_inputs)
        synchronize(device)
        # The host's own latency between a finished stream and a device-wide synchronize, measured
        # the same way on an empty call, is taken off each run's gap (20 to 70 us on an H100 host).
        idle_gap_ms = _idle_gap_ms() if device.type == "cuda" else 0.0
        times_ms: list[float] = []
        gaps_ms: list[float] = []
        spent_s = 0.0
        for run in range(config.max_runs):
            last = run == config.max_runs - 1 or (run >= config.min_runs - 1 and spent_s >= config.budget_s)
            index = len(input_sets) - 1 if last else run % len(rotation)
            output = None  # free the previous output before the next run allocates its own
            _refill(live_inputs, input_sets[index])
            synchronize(device)
            flush_buffer.fill_(float(run))
            if device.type == "cuda":
                elapsed_ms, gap_ms, output = _time_one_cuda(fn, live_inputs)
                gaps_ms.append(gap_ms)
            else:
                elapsed_ms, output = _time_one_host(fn, live_inputs, device)
            times_ms.append(elapsed_ms)
            spent_s += elapsed_ms / 1000
            if last:
                break
        last_output, first_sight_ms = output, [elapsed_ms]
        seen_median_ms = statistics.median(times_ms[:-1]) if len(times_ms) > 1 else None
        recheck_ms = None
        if spare is not None and seen_median_ms is not None and _suspect(elapsed_ms, seen_median_ms):
            last_output = _copy_of(output)  # a kernel may hand back the same buffer on every call
            output = None
            # A seen set, then the spare, back to back: a busy machine slows both, remembering only the spare.
            recheck_ms = _time_one(fn, live_inputs, rotation[0], flush_buffer, device)
            first_sight_ms.append(_time_one(fn, live_inputs, spare, flush_buffer, device))
    times_ms.sort()
    return Timing(
        median_ms=statistics.median(times_ms),
        p10_ms=_percentile(times_ms, 0.1),
        p90_ms=_percentile(times_ms, 0.9),
        runs=len(times_ms),
        last_output=last_output,
        last_input_index=index,
        sync_gap_ms=max(0.0, statistics.median(gaps_ms) - idle_gap_ms) if gaps_ms else 0.0,
        seen_median_ms=seen_median_ms,
        first_sight_ms=tuple(first_sight_ms),
        seen_recheck_ms=recheck_ms,
    )


def _time_one(
    fn: Callable[..., Any], live_inputs: list[Any], values: list[Any], flush_buffer: torch.Tensor, device: torch.device
) -> float:
    """One more timed run on `values`, prepared as the timed runs are; its output is dropped."""
    _refill(live_inputs, values)
    synchronize(device)
    flush_buffer.fill_(-1.0)
    if device.type == "cuda":
        return _time_one_cuda(fn, live_inputs)[0]
    return _time_one_host(fn, live_inputs, device)[0]


def _copy_of(output: Any) -> Any:
    if isinstance(output, (tuple, list)):
        return type(output)(_copy_of(o) for o in output)
    return output.clone() if isinstance(output, torch.Tensor) else output


def _suspect(first_sight_ms: float, seen_median_ms: float) -> bool:
    return first_sight_ms > max(REMEMBERED_FACTOR * seen_median_ms, seen_median_ms + REMEMBERED_MIN_GAP_MS)


def remembered_ms(timing: Timing) -> float | None:
    """INTEGRITY.md row 3 by content: the faster of the two runs on unseen inputs when both are far
    slower than runs on inputs seen before (the last timed run against the median, the spare's against
    a seen set's run just before it); else None. An honest kernel takes as long on new inputs as on
    old ones; one that looks its output up by the inputs' contents only really computes on new ones.
    One noisy run is not enough, and a machine busy through the recheck slows both of its runs."""
    last, spare = (timing.first_sight_ms + (None,))[:2]
    if timing.seen_median_ms is None or spare is None or timing.seen_recheck_ms is None:
        return None
    if _suspect(last, timing.seen_median_ms) and _suspect(spare, timing.seen_recheck_ms):
        return min(last, spare)
    return None


def _refill(live_inputs: list[Any], values: list[Any]) -> None:
    for index, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            live_inputs[index].copy_(value)
        else:
            live_inputs[index] = value


def hidden_work_ms(timing: Timing) -> float | None:
    """The work a candidate seems to hide on side streams: `sync_gap_ms` (host latency already taken
    off) when it exceeds both 0.1 ms and half the measured runtime."""
    gap = timing.sync_gap_ms
    return gap if gap > max(SIDE_STREAM_MIN_GAP_MS, 0.5 * timing.median_ms) else None


def _idle_gap_ms(samples: int = 7) -> float:
    gaps = []
    for _ in range(samples):
        _device_synchronize()
        gaps.append(_time_one_cuda(lambda: None, [])[1])
    return statistics.median(gaps)


def _time_one_cuda(fn: Callable[..., Any], inputs: list[Any]) -> tuple[float, float, Any]:
    start, end, synchronized_end = (_Event(enable_timing=True) for _ in range(3))
    _spin(LAUNCH_COVER_CYCLES)
    _record(start)
    output = fn(*inputs)
    _record(end)
    _device_synchronize()  # whole device, side streams included
    _record(synchronized_end)
    _event_synchronize(synchronized_end)
    return _elapsed_time(start, end), _elapsed_time(end, synchronized_end), output


def _time_one_host(fn: Callable[..., Any], inputs: list[Any], device: torch.device) -> tuple[float, Any]:
    start_s = _clock()
    output = fn(*inputs)
    synchronize(device)
    return (_clock() - start_s) * 1000, output
