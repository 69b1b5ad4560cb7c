"""Which torch operators and device kernels a forward ran (INTEGRITY.md rows 1 and 18), recorded at
runtime.

The static pre-check sees `torch.matmul` in the source; this sees what actually ran, however it was
reached (getattr, a helper, a library layer, an `except` fallback, at::mm from C++ in a
load_inline extension), on every thread of the process: torch's profiler with
`profile_all_threads`, so an op called from a helper thread or a thread C++ started is seen too
(a TorchDispatchMode sees only its own thread). Where that option is missing (older torch), the
recording falls back to the calling thread and says so. On a GPU the device trace (CUPTI, through
the same profiler) names every kernel the process launched, on any stream: a cuBLAS or cuDNN kernel
called from C++ or through ctypes, past torch's dispatcher, is seen by its name (`library_kernels`).
It runs in the candidate's process, so it is a first line: the orchestrator's judging stands behind it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

# Bound at import, before any candidate runs: a candidate that replaces these (a record_function
# that records nothing, a _sleep that launches nothing) would otherwise hide the marker and with it
# the side-stream check
import torch
from torch.autograd.profiler import profile, record_function
from torch.cuda import _sleep as _marker_kernel

_clock = time.perf_counter
_copy = torch.Tensor.copy_
_REACHED: dict[str, Any] = {}  # a 4-byte device tensor and its pinned host twin, made on first use

# Allocation, views, copies and shape queries: a kernel needs them, they compute nothing.
ALWAYS_ALLOWED = frozenset(
    """empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like
    new_ones full full_like new_full fill_ zero_ copy_ clone contiguous _to_copy to view _unsafe_view reshape
    _reshape_alias as_strided expand expand_as permute transpose t unsqueeze squeeze select slice narrow detach
    alias lift_fresh lift_fresh_copy resize_ unbind split split_with_sizes chunk flatten unflatten view_as
    set_ arange scalar_tensor _local_scalar_dense is_same_size sym_size sym_stride sym_numel sym_storage_offset
    stride size numel dim is_contiguous""".split()
)
# Asking for one of these when the reference computes another is still calling the library for it.
MATMUL_FAMILY = frozenset("mm addmm bmm baddbmm matmul linear addmv mv dot vdot _addmm_activation einsum".split())
CONVOLUTION_FAMILY = frozenset(
    """convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d
    cudnn_convolution cudnn_convolution_transpose convolution_overrideable""".split()
)
KERNEL_PREFIX = "kernel:"  # a device kernel's name among the recorded ops
# Words in the kernel names of NVIDIA's prebuilt libraries: cuBLAS and cuBLASLt (sgemm, xmma_gemm,
# gemv, nvjet on Hopper, split-K reductions) and cuDNN (implicit GEMM, Winograd, FFT convolutions).
LIBRARY_KERNEL_WORDS = re.compile(
    r"gemm|gemv|xmma|nvjet|cublas|splitkreduce|cudnn|convolve|winograd|fft|dgrad|wgrad", re.IGNORECASE
)


def record_ops(
    fn: Callable[..., Any], *args: Any, all_threads: bool = True, device_kernels: bool = False
) -> tuple[Any, set[str], float | None]:
    """fn(*args), the set of aten operator names (e.g. 'mm', 'relu') dispatched while it ran, on
    every thread of the process (`all_threads`) or on the calling thread alone, and with
    `device_kernels` also the names of the CUDA kernels it launched (as KERNEL_PREFIX + name) and
    how far in ms its device work on any stream lay outside the current stream's span of fn (see
    _outside_ms; None where that span is not in the trace). One profiler per
    process at a time: the orchestrator records references under a lock (tasks/trusted.py)."""
    # torch.profiler.profile would look for torch._inductor, which imports dynamo (1 s) and replaces
    # torch.manual_seed: the autograd profiler underneath it does the recording without that.
    config = _all_threads_config() if all_threads else None
    device = "cuda" if device_kernels else None
    # Made before the profiler starts: the first call's fill of them would be device work in the
    # trace before the gate, which _outside_ms counts as work started early (a fresh worker's first
    # watched call, one no standby warm-up traced before, would be side_stream)
    source, target = _reached_buffers() if device_kernels else (None, None)
    with profile(use_kineto=True, use_device=device, experimental_config=config) as recorded:
        if not device_kernels:
            result = fn(*args)
        else:
            # Inside one annotation: a gate kernel on the current stream, fn, and a marker on the
            # current stream queued the moment fn returns. Work fn orders after the current stream
            # starts after the gate; the marker starts once the current stream has done fn's work.
            # The gate outlasts fn's host time, so the marker is queued before the gate ends: a short
            # kernel on a private stream still runs when it starts. The marker is a 4-byte copy to
            # pinned memory, which a copy engine runs: a kernel would wait for a free multiprocessor,
            # behind the blocks of a private-stream kernel launched just before it, and start only
            # as that kernel's last wave ran (measured on an H200: 3-9 us of a 25 us ReLU left outside).
            with record_function(MARKER):
                _marker_kernel(_GATE["cycles"])
                began = _clock()
                result = fn(*args)
                _copy(target, source, non_blocking=True)
                host_ms = (_clock() - began) * 1000
    names = set()
    for event in recorded.function_events:
        if event.name.startswith("aten::"):
            names.add(event.name[6:].split(".")[0])
        for kernel in getattr(event, "kernels", None) or []:  # device kernels, by the launch that made them
            names.add(KERNEL_PREFIX + kernel.name)
        if device_kernels and str(getattr(event, "device_type", "")).endswith("CUDA"):
            names.add(KERNEL_PREFIX + event.name)
    if not device_kernels:
        return result, names, None
    outside_ms, gate_ms = _outside_ms(recorded)
    if gate_ms:  # the next gate: twice this call's host time, in the cycles this one took
        _GATE["cycles_per_ms"] = _GATE["cycles"] / gate_ms
        set_gate_ms(min(GATE_MAX_MS, max(GATE_MIN_MS, 2 * host_ms)))
    return result, names, outside_ms


def _reached_buffers() -> tuple[Any, Any]:
    if not _REACHED:
        _REACHED["source"] = torch.zeros(1, dtype=torch.int32, device="cuda")
        _REACHED["target"] = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    return _REACHED["source"], _REACHED["target"]


def set_gate_ms(target_ms: float) -> None:
    """Size the next watched call's gate kernel to about `target_ms` on this device (from the
    cycles per ms the last trace measured)."""
    _GATE["cycles"] = max(1, int(_GATE["cycles_per_ms"] * target_ms))


MARKER = "kforge::marker"
MARKER_FORGED = 1e6  # ms: a second marker in the trace is the candidate's
# A forward that synchronizes holds the host until the gate ends, so its host time says nothing of
# how long a gate it needs: the cap bounds that growth (past it, a call's host time dwarfs what
# a hidden kernel could gain)
GATE_MIN_MS, GATE_MAX_MS = 1.0, 20.0
# The first watched call of a worker sets up what later calls reuse (streams, allocator, lazy
# loading): its host time is the longest, and a gate sized by empty warm-up calls would end before
# it returns (its late side-stream work then escapes the marker)
GATE_FIRST_MS = 10.0
_GATE = {"cycles": int(2e6 * GATE_FIRST_MS), "cycles_per_ms": 2e6}  # an H200's clock; measured by each trace


def _outside_ms(recorded: Any) -> tuple[float | None, float | None]:
    """How far (ms) the device work in a profile lies outside the current stream's span of the call:
    the longest of how early it started before the gate kernel ended and how late it ended after
    the marker kernel started (0.0 for none; None where gate or marker are missing from the trace,
    MARKER_FORGED where it holds more than one annotation), and how long the gate ran (ms, or None).
    The raw trace: function_events keeps device work only as durations."""
    events = recorded.kineto_results.events()
    # The annotation on the host; kineto lists it again on the device, over the kernels in it
    markers = [e for e in events if e.name() == MARKER and str(e.device_type()).endswith("CPU")]
    if len(markers) != 1:
        return (MARKER_FORGED if markers else None), None
    mark = markers[0]
    # The gate's launch is the first kernel launch on the annotation's thread inside it, the marker's
    # the last copy there
    inside = sorted(
        (
            e
            for e in events
            if e.start_thread_id() == mark.start_thread_id() and mark.start_ns() <= e.start_ns() <= mark.end_ns()
        ),
        key=lambda e: e.start_ns(),
    )
    kernel_launches = [e for e in inside if "LaunchKernel" in e.name()]
    copies = [e for e in inside if e.name().startswith("cudaMemcpy")]
    # Device work: kernels, copies and fills; not the synchronizations CUPTI also lists on the device
    device = [
        e
        for e in events
        if str(e.device_type()).endswith("CUDA") and e.name() != MARKER and "sync" not in e.name().lower()
    ]
    if not kernel_launches or not copies:
        return None, None
    # A launch inside the annotation without its kernel on the device was hidden from the trace
    # (the candidate turned kernel records off after the gate): the trace cannot judge the call
    recorded_ids = {e.correlation_id() for e in device}
    launched_ids = {
        e.correlation_id()
        for e in events
        if "LaunchKernel" in e.name() and mark.start_ns() <= e.start_ns() <= mark.end_ns()
    }
    if not launched_ids <= recorded_ids:
        return None, None
    gate = [e for e in device if e.correlation_id() == kernel_launches[0].correlation_id()]
    marked = [e for e in device if e.correlation_id() == copies[-1].correlation_id()]
    if not gate or not marked:
        return None, None
    opened_ns, reached_ns = gate[0].end_ns(), marked[0].start_ns()
    work = [e for e in device if e is not gate[0] and e is not marked[0]]
    early = max((opened_ns - e.start_ns() for e in work), default=0)
    late = max((e.end_ns() - reached_ns for e in work), default=0)
    return max(0.0, early / 1e6, late / 1e6), (opened_ns - gate[0].start_ns()) / 1e6


def _all_threads_config() -> Any:
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):  # an older torch: the calling thread only
        print("kforge: warning: this torch records ops on the calling thread only", flush=True)
        return None


def library_calls(reference_ops: set[str], candidate_ops: set[str]) -> list[str]:
    """The compute operators the candidate dispatched that the reference computes (sorted)."""
    computed = reference_ops - ALWAYS_ALLOWED
    if computed & MATMUL_FAMILY:
        computed |= MATMUL_FAMILY
    return sorted(candidate_ops & computed)


def library_kernels(reference_ops: set[str], candidate_ops: set[str], candidate_source: str) -> list[str]:
    """The device kernels the candidate ran that come from NVIDIA's prebuilt math libraries, where the
    reference computes a matrix product or a convolution (sorted). A kernel the candidate wrote
    itself is one whose name appears in its source (CUTLASS templates it compiles included)."""
    computed = reference_ops - ALWAYS_ALLOWED
    if not computed & (MATMUL_FAMILY | CONVOLUTION_FAMILY):
        return []
    found = []
    for op in candidate_ops:
        if not op.startswith(KERNEL_PREFIX):
            continue
        name = op[len(KERNEL_PREFIX) :]
        if LIBRARY_KERNEL_WORDS.search(name) and not _own_kernel(name, candidate_source):
            found.append(name)
    return sorted(found)


def _own_kernel(name: str, source: str) -> bool:
    """Whether the kernel `name` (as CUPTI demangles it) is named in `source`: its function name, or
    the CUTLASS namespace a template instantiation of the candidate's carries."""
    base = re.sub(r"^void\s+", "", name).split("(")[0].split("<")[0].split("::")[-1].strip()
    if len(base) >= 4 and re.search(rf"\b{re.escape(base)}\b", source):
        return True
    return "cutlass" in name.lower() and "cutlass" in source.lower()
