"""Workers started ahead of need, so a stage does not wait for an interpreter and torch to start."""

from __future__ import annotations

import atexit
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

from tasks.isolate import _close, _start_worker, _Worker


class WorkerPool:
    """Workers started ahead of need: torch imported and, on a GPU backend, the CUDA context made,
    each waiting for exactly one request. Every request still gets a process of its own that exits
    after it, so a candidate that corrupts its process or its CUDA context takes only itself down.

    Processes are started from one long-lived thread: the workers' parent-death signal fires when
    the thread that started them ends, and Prefect's task threads come and go. A spare is replaced
    as soon as it is taken, except after timing stages, whose replacement waits until the timing
    worker has finished so a starting interpreter does not steal CPU from a measurement.
    (Holding timing stages until every spare had warmed up, and starting none during them, halved
    the H100 throughput of 8 candidates in flight, 2,850 -> 1,457 per GPU-hour, and was dropped.)
    """

    def __init__(self, size: int):
        self.size = size
        self._spares: dict[tuple, list[_Worker]] = {}
        self._lock = threading.Lock()
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kforge-worker-starter")
        atexit.register(self.close)

    def _start_standby(self, env: dict[str, str], warm_device: str) -> _Worker:
        argv = ["--standby", "{control}", warm_device]
        return self._starter.submit(_start_worker, argv, env, subprocess.PIPE).result()

    def _refill(self, key: tuple, env: dict[str, str], warm_device: str) -> None:
        def fill() -> None:
            with self._lock:
                missing = self.size - len(self._spares.get(key, []))
            for _ in range(max(0, missing)):
                worker = _start_worker(["--standby", "{control}", warm_device], env, subprocess.PIPE)
                with self._lock:
                    self._spares.setdefault(key, []).append(worker)

        self._starter.submit(fill)

    def take(self, env: dict[str, str], warm_device: str, refill_now: bool) -> _Worker:
        """A waiting worker for this environment (started now if none is ready). Spares kept for
        another run's environment (its cache or threads) are closed: one run's at a time; those of
        the same run bound to another GPU (CUDA_VISIBLE_DEVICES, tasks/gpus.py) stay."""
        key = (tuple(sorted(env.items())), warm_device)
        with self._lock:
            stale_keys = [other for other in self._spares if _run_of(other) != _run_of(key)]
            stale = [w for other in stale_keys for w in self._spares.pop(other)]
            self._spares.setdefault(key, [])
            ready = self._spares[key]
            worker = ready.pop(0) if ready else None
        for spare in stale:
            _close(spare)
        if worker is not None and worker.process.poll() is not None:
            _close(worker)  # it died waiting: its directories and user id go with it
            worker = None
        if worker is None:
            worker = self._start_standby(env, warm_device)
        if refill_now:
            self._refill(key, env, warm_device)
        return worker

    def refill(self, env: dict[str, str], warm_device: str) -> None:
        self._refill((tuple(sorted(env.items())), warm_device), env, warm_device)

    def close(self) -> None:
        with self._lock:
            spares = [w for workers in self._spares.values() for w in workers]
            self._spares.clear()
        for worker in spares:
            _close(worker)


def _run_of(key: tuple) -> tuple:
    """A spare's key without the GPU it is bound to: which run's workers it is."""
    items, warm_device = key
    return tuple(item for item in items if item[0] != "CUDA_VISIBLE_DEVICES"), warm_device


_pools: dict[int, WorkerPool] = {}


def worker_pool(size: int) -> WorkerPool | None:
    """The process-wide pool of `size` spares (None for size 0: start each worker on demand)."""
    if size <= 0:
        return None
    with _pool_lock:
        return _pools.setdefault(size, WorkerPool(size))


_pool_lock = threading.Lock()
