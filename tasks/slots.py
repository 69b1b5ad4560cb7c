"""Which stages may run at once on this host: one GPU stage at a time, and timing alone on the cpu.

GPU stages (verify, time, baseline) take the GPU one at a time per process: compiles of other
candidates run beside them on the CPU cores, but two candidates never share the GPU while one of
them is measured. On the cpu backend the cores are the device: a timing stage runs alone, while
compiles and checks of other problems may overlap one another (one lock for every cpu stage would
make parallel problems sequential again, and worker start-up and g++ are most of a problem's wall
time).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

TIMING_MODES = ("time", "baseline")
PAIRED_MODE = "paired"
GPU_MODES = ("verify", "time", "baseline")  # every stage that runs on the device
_gpu_slot = threading.Lock()


class SharedOrAlone:
    """Held by any number of stages at once (`shared`) or by one stage alone (`alone`); a stage
    waiting to be alone goes first, so a stream of shared stages cannot starve it."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._sharing = 0
        self._alone = False
        self._waiting_alone = 0

    @contextlib.contextmanager
    def shared(self):
        with self._changed:
            self._changed.wait_for(lambda: not self._alone and not self._waiting_alone)
            self._sharing += 1
        try:
            yield
        finally:
            with self._changed:
                self._sharing -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def alone(self):
        with self._changed:
            self._waiting_alone += 1
            self._changed.wait_for(lambda: not self._alone and not self._sharing)
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


_cpu_cores = SharedOrAlone()


def device_slot(backend: str, mode: str) -> Any:
    """The slot a `mode` stage of `backend` holds while its worker runs: the GPU, or the CPU cores.
    `paired`: the reference worker timed beside a candidate, inside the time stage's slot."""
    if mode == PAIRED_MODE:
        return contextlib.nullcontext()
    if backend == "cpu":
        return _cpu_cores.alone() if mode in TIMING_MODES else _cpu_cores.shared()
    return _gpu_slot if backend in ("cuda", "triton") and mode in GPU_MODES else contextlib.nullcontext()
