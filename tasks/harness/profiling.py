"""The worker's side of the profile stage: warm up a built model, then profile ONE call of it.

Profiles are advisory: they guide the agents (what to optimise next) and never decide a verdict or
a time, so the inputs come from the problem module's own get_inputs() under the request's seed, in
this (the candidate's) process, rather than from the orchestrator (tasks/trusted.py).

With `profiler` "torch" the call runs under torch's profiler (CPU activities, plus CUDA kernels on
a GPU backend) and the result holds one row per (op or kernel, input shapes): self and total time
in microseconds and the number of calls, the top `max_rows` of each section by self time. With
"ncu", Nsight Compute wraps this process from the orchestrator's side (tasks/profile.py): the
profiled call is marked with cudaProfilerStart/Stop and ncu itself writes the rows.
"""

from __future__ import annotations

import time
import types
from typing import Any

import torch

from tasks.harness import modules
from tasks.harness.dispatch import _all_threads_config
from tasks.harness.protocol import WorkerRequest

CPU_SECTION, CUDA_SECTION = "cpu_ops", "cuda_kernels"


def profile_model(
    model: torch.nn.Module, problem: types.ModuleType, device: torch.device, request: WorkerRequest
) -> dict[str, Any]:
    """Warm-up calls, then one profiled call of `model` on the problem's inputs; the result dict
    (outcome "correct": the call ran). Exceptions of the model's forward propagate to the caller."""
    inputs = modules.make_inputs(problem, request.input_seed, device)
    label = f"{type(model).__name__}.forward"  # a candidate's own native kernels run inside this row
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(request.warmup_calls):
            model(*inputs)
        modules.synchronize(device)
        if request.profiler == "ncu":
            _marked_call(model, inputs, device)
            return {"outcome": "correct", "tool": "ncu", "rows": [], "profile_s": time.perf_counter() - start}
        recorded = _profiled_call(model, inputs, device, label)
    rows, truncated = _rows(recorded, request.max_rows)
    return {
        "outcome": "correct",
        "tool": "torch.profiler",
        "tool_version": torch.__version__,
        "device": str(device),
        "rows": rows,
        "truncated": truncated,
        "profile_s": time.perf_counter() - start,
    }


def _marked_call(model: torch.nn.Module, inputs: list[Any], device: torch.device) -> None:
    """One call between cudaProfilerStart and Stop: ncu runs with --profile-from-start off."""
    if device.type != "cuda":  # nothing for ncu to see: the orchestrator falls back to torch.profiler
        model(*inputs)
        return
    torch.cuda.profiler.start()
    model(*inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _profiled_call(model: torch.nn.Module, inputs: list[Any], device: torch.device, label: str) -> Any:
    # The autograd profiler under torch.profiler.profile: the latter imports torch._inductor (1 s),
    # which replaces torch.manual_seed (as tasks/harness/dispatch.py notes). Same Kineto recording.
    from torch.autograd.profiler import profile, record_function

    use_device = "cuda" if device.type == "cuda" else None
    with profile(
        use_kineto=True, use_device=use_device, record_shapes=True, experimental_config=_all_threads_config()
    ) as recorded:
        with record_function(label):
            model(*inputs)
        modules.synchronize(device)
    return recorded


def _rows(recorded: Any, max_rows: int) -> tuple[list[dict[str, Any]], bool]:
    """Per (name, input shapes) rows of each section, the top `max_rows` of each by self time."""
    sections: dict[str, list[dict[str, Any]]] = {CPU_SECTION: [], CUDA_SECTION: []}
    for entry in recorded.key_averages(group_by_input_shape=True):
        on_device = str(getattr(entry, "device_type", "")).endswith("CUDA")
        sections[CUDA_SECTION if on_device else CPU_SECTION].append(_row(entry, on_device))
    rows, truncated = [], False
    for section, entries in sections.items():
        entries.sort(key=lambda row: row["self_time_us"], reverse=True)
        truncated = truncated or len(entries) > max_rows
        rows.extend({"section": section, **row} for row in entries[:max_rows])
    return rows, truncated


def _row(entry: Any, on_device: bool) -> dict[str, Any]:
    if on_device:  # a kernel: its time is device time (the CPU-side names differ across torch versions)
        self_us = _first_attr(entry, "self_device_time_total", "self_cuda_time_total")
        total_us = _first_attr(entry, "device_time_total", "cuda_time_total")
    else:
        self_us, total_us = entry.self_cpu_time_total, entry.cpu_time_total
    shapes = getattr(entry, "input_shapes", None)
    return {
        "name": entry.key,
        "input_shapes": str(shapes) if shapes else "",
        "self_time_us": float(self_us),
        "total_time_us": float(total_us),
        "calls": int(entry.count),
    }


def _first_attr(entry: Any, *names: str) -> float:
    for name in names:
        if hasattr(entry, name):
            return float(getattr(entry, name) or 0)
    return 0.0
