"""The timing protocol, written once for the candidate and both baselines.

Warm up, then time each run alone: flush the last-level cache, synchronize the whole device,
start the clock, run, synchronize the whole device, stop the clock. Inputs rotate over several
sets drawn from seeds the candidate never saw. On CUDA the clock is a pair of events; elsewhere
`time.perf_counter`. Reported: median, p10 and p90 in milliseconds, and the number of runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tasks.harness.modules import synchronize

# Bigger than the last-level cache of the CPUs and GPUs we run on (H100 L2 is 50 MB).
FLUSH_BYTES = 64 * 1024 * 1024


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


def _percentile(sorted_values: list[float], fraction: float) -> float:
    position = fraction * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def time_callable(
    fn: Callable[..., Any], input_sets: list[list[Any]], device: torch.device, config: TimingConfig
) -> Timing:
    """Time `fn(*inputs)` over rotating `input_sets` with the protocol above."""
    flush_buffer = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    output = None
    with torch.no_grad():
        for run in range(config.warmup_runs):
            output = fn(*input_sets[run % len(input_sets)])
        synchronize(device)
        times_ms: list[float] = []
        spent_s = 0.0
        index = 0
        for run in range(config.max_runs):
            if run >= config.min_runs and spent_s >= config.budget_s:
                break
            index = run % len(input_sets)
            flush_buffer.fill_(float(run))
            output = None  # free the previous output before the next run allocates its own
            elapsed_ms, output = _time_one(fn, input_sets[index], device)
            times_ms.append(elapsed_ms)
            spent_s += elapsed_ms / 1000
    times_ms.sort()
    return Timing(
        median_ms=statistics.median(times_ms),
        p10_ms=_percentile(times_ms, 0.1),
        p90_ms=_percentile(times_ms, 0.9),
        runs=len(times_ms),
        last_output=output,
        last_input_index=index,
    )


def _time_one(fn: Callable[..., Any], inputs: list[Any], device: torch.device) -> tuple[float, Any]:
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        output = fn(*inputs)
        torch.cuda.synchronize()  # whole device, so work on side streams is inside the window
        end.record()
        end.synchronize()
        return start.elapsed_time(end), output
    start_s = time.perf_counter()
    output = fn(*inputs)
    synchronize(device)
    return (time.perf_counter() - start_s) * 1000, output
