"""A host's GPUs shared out: each problem's stages on one GPU, the least busy one when it starts.

A problem keeps its GPU from its first stage to its last, so its baseline and its candidates are
timed on the same device and their times compare. Each GPU has a timing slot of its own
(tasks/slots.py), so problems on different GPUs are timed at the same time. A worker is bound to its
problem's GPU with `CUDA_VISIBLE_DEVICES` (its `cuda:0` is that GPU); this process addresses it by
its own index (`RunConfig.gpu_index`). With one GPU nothing is rebound: index 0, the worker's
environment as before.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

GPU_BACKENDS = ("cuda", "triton")
_lock = threading.Lock()
_in_flight: Counter[int] = Counter()  # problems holding each GPU now, in this process


def run_gpus(backend: str, chosen: Sequence[int] | None = None, visible: int | None = None) -> list[int]:
    """The GPU indices a run spreads its problems over: `chosen` (the `gpus` setting), else every GPU
    this process sees (`visible`, default torch's device count); none on the cpu backend."""
    if backend not in GPU_BACKENDS:
        return []
    if chosen:
        return list(dict.fromkeys(chosen))
    if visible is None:
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 1
    return list(range(max(1, visible)))


def least_busy(indices: Sequence[int], in_flight: Mapping[int, int]) -> int:
    """The GPU with the fewest problems in flight; on a tie, the first listed."""
    return min(indices, key=lambda index: (in_flight.get(index, 0), list(indices).index(index)))


@contextlib.contextmanager
def problem_gpu(config: Any, visible: int | None = None) -> Iterator[Any]:
    """`config` with `gpu_index` set to the least busy of the run's GPUs, held for the block; the
    config as it is on the cpu backend."""
    indices = run_gpus(config.backend, config.gpus, visible)
    if not indices:
        yield config
        return
    with _lock:
        index = least_busy(indices, _in_flight)
        _in_flight[index] += 1
    try:
        yield config.model_copy(update={"gpu_index": index, "gpus": indices})
    finally:
        with _lock:
            _in_flight[index] -= 1


def in_flight() -> dict[int, int]:
    """Problems holding each GPU now (for the log and tests)."""
    with _lock:
        return {index: count for index, count in _in_flight.items() if count}


def visible_devices(index: int, uuid: str | None, parent_visible: str | None) -> str:
    """The `CUDA_VISIBLE_DEVICES` value that makes this process's GPU `index` a worker's only GPU: its
    UUID where known, else the entry `index` of this process's own list (or `index` itself)."""
    if uuid:
        return uuid
    entries = [entry.strip() for entry in (parent_visible or "").split(",") if entry.strip()]
    return entries[index] if index < len(entries) else str(index)


def worker_binding(backend: str, index: int, spread: Sequence[int] | None, parent_visible: str | None) -> str | None:
    """The `CUDA_VISIBLE_DEVICES` for a worker of a stage on GPU `index` (None: leave the environment
    as it is, the single-GPU case: index 0 of a run on one GPU)."""
    if backend not in GPU_BACKENDS or (index == 0 and len(spread or ()) <= 1):
        return None
    return visible_devices(index, gpu_of(backend, index)["gpu_uuid"], parent_visible)


@functools.cache
def gpu_of(backend: str, index: int = 0) -> dict[str, Any]:
    """The GPU a `backend` attempt's stages ran on: its index as this process numbers them, and its
    name and UUID as torch reports them (None where torch sees no such device; all None on the cpu)."""
    if backend == "cpu":
        return {"gpu_index": None, "gpu_name": None, "gpu_uuid": None}
    unknown = {"gpu_index": index, "gpu_name": None, "gpu_uuid": None}
    try:
        import torch

        properties = torch.cuda.get_device_properties(index)
    except Exception:  # noqa: BLE001 - no such device seen here: name and UUID stay unknown
        return unknown
    uuid = getattr(properties, "uuid", None)
    return {"gpu_index": index, "gpu_name": properties.name, "gpu_uuid": f"GPU-{uuid}" if uuid else None}


@contextlib.contextmanager
def current(backend: str, index: int) -> Iterator[None]:
    """GPU `index` current on this thread while the block runs (this process's work for the stage:
    the reference, inputs, copies, the IPC mappings of the worker's buffers)."""
    if backend not in GPU_BACKENDS or index == 0:
        yield
        return
    import torch

    with torch.cuda.device(index):
        yield
