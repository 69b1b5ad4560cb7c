"""Which stages may run at once on this host: one GPU stage at a time, and timing alone on the cpu.

GPU stages (verify, time, baseline) take their GPU one at a time per process (a slot per GPU: a
problem's stages all use its GPU, tasks/gpus.py): compiles of other candidates run beside them on
the CPU cores, but two candidates never share a GPU while one of them is measured. On the cpu
backend the cores are the device: a timing stage runs alone, while compiles and checks of other
problems may overlap one another (one lock for every cpu stage would make parallel problems
sequential again, and worker start-up and g++ are most of a problem's wall time).

Problems are admitted to the device by their planned memory (`admitted`): a problem reserves the
peak its timing stage plans for (tasks/memory.py) from its first stage on the device to its end, and
waits, first come first served, until that fits beside the problems in flight; one that would not
fit any company runs alone. So a 6 GB-per-tensor KernelBench problem runs beside small ones, not
beside three of its kind.

A stage that ran out of device memory is retried alone on the host (`alone_on_host`): every other
stage of this process, compiles included (they build models on the GPU too), finishes first and new
ones wait, so the retry meets only its own memory.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from tasks import trace

TIMING_MODES = ("time", "baseline")
PAIRED_MODE = "paired"
# A GPU backend's torch.compile baseline: its worker starts and compiles sharing the host, and
# takes the GPU slot for its timed calls only (`timing_after_setup`)
COMPILED_BASELINE_MODE = "baseline-compiled"
GPU_MODES = ("verify", "time", "baseline", "profile")  # every stage that runs on the device
_gpu_slots: dict[int, threading.Lock] = {}  # one timing slot per GPU index (tasks/gpus.py)
_gpu_slots_lock = threading.Lock()
STOP_POLL_S = 0.5  # how often a wait for device memory asks whether kforge is stopping


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
_gpu_host = SharedOrAlone()  # every stage of a GPU backend shares it; a retry after running out of memory is alone
_alone_here = threading.local()


def holding_alone() -> bool:
    """Whether this thread's stage has the host to itself (`alone_on_host`)."""
    return getattr(_alone_here, "held", False)


@contextlib.contextmanager
def alone_on_host(backend: str) -> Iterator[None]:
    """The host to this thread's stage alone: the other stages of this process end first, new ones wait."""
    with (_cpu_cores if backend == "cpu" else _gpu_host).alone():
        _alone_here.held = True
        try:
            yield
        finally:
            _alone_here.held = False


def _gpu_slot(gpu: int) -> threading.Lock:
    with _gpu_slots_lock:
        return _gpu_slots.setdefault(gpu, threading.Lock())


def device_slot(backend: str, mode: str, gpu: int = 0) -> Any:
    """The slot a `mode` stage of `backend` holds while its worker runs: the GPU, or the CPU cores.
    `paired`: the reference worker timed beside a candidate, inside the time stage's slot. Traced as
    `slot-wait` and `slot` spans (tasks/trace.py)."""
    if mode == PAIRED_MODE:
        return contextlib.nullcontext()
    if backend == "cpu":
        if holding_alone():
            return contextlib.nullcontext()
        return _traced(_cpu_cores.alone() if mode in TIMING_MODES else _cpu_cores.shared(), mode)
    if backend not in ("cuda", "triton"):
        return contextlib.nullcontext()
    return _gpu_stage(mode in GPU_MODES, mode, gpu)


def timing_after_setup(backend: str, gpu: int = 0) -> Any:
    """Inside a COMPILED_BASELINE_MODE stage of a GPU backend: its GPU's slot, for the timed calls
    (the stage holds the host's shared side already). Elsewhere nothing: those stages hold their
    slot from their start."""
    if backend not in ("cuda", "triton"):
        return contextlib.nullcontext()
    return _traced(_gpu_slot(gpu), "baseline", gpu)


@contextlib.contextmanager
def _gpu_stage(on_device: bool, mode: str, gpu: int) -> Iterator[None]:
    with contextlib.ExitStack() as held:
        if not holding_alone():
            held.enter_context(_gpu_host.shared())
        if on_device:
            held.enter_context(_traced(_gpu_slot(gpu), mode, gpu))
        yield


@contextlib.contextmanager
def _traced(slot: Any, mode: str, gpu: int | None = None) -> Iterator[None]:
    asked = time.time()
    with slot:
        got = time.time()
        trace.record("slot-wait", asked, got - asked, mode=mode, gpu=gpu)
        try:
            yield
        finally:
            trace.record("slot", got, time.time() - got, mode=mode, gpu=gpu)


class ByteBudget:
    """Reservations of device bytes against a budget, granted in the order asked; a reservation
    larger than the budget is granted when nothing else is reserved."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._reserved = 0
        self._holders = 0
        self._queue: deque[object] = deque()

    def reserved(self) -> tuple[int, int]:
        """(bytes reserved, reservations held) now."""
        with self._changed:
            return self._reserved, self._holders

    @contextlib.contextmanager
    def reserve(self, nbytes: int, budget: int, on_wait: Any = None, check_stop: Any = None) -> Iterator[None]:
        """Hold `nbytes` of `budget` while the block runs; `on_wait(reserved, holders)` is called once
        if the reservation has to wait, and `check_stop()` about every STOP_POLL_S while it waits (it
        raises to give the wait up: kforge is stopping)."""
        ticket = object()
        with self._changed:
            self._queue.append(ticket)

            def granted() -> bool:
                fits = self._holders == 0 or self._reserved + nbytes <= budget
                return self._queue[0] is ticket and fits

            if not granted() and on_wait is not None:
                on_wait(self._reserved, self._holders)
            try:
                while not granted():
                    self._changed.wait(STOP_POLL_S)
                    if check_stop is not None:
                        check_stop()
            except BaseException:
                self._queue.remove(ticket)
                self._changed.notify_all()  # the next in line may be first now
                raise
            self._queue.popleft()
            self._reserved += nbytes
            self._holders += 1
            self._changed.notify_all()  # the next in line may fit too
        try:
            yield
        finally:
            with self._changed:
                self._reserved -= nbytes
                self._holders -= 1
                self._changed.notify_all()


_device_memory: dict[int, ByteBudget] = {}  # per GPU index


def admitted(nbytes: int, budget: int, on_wait: Any = None, check_stop: Any = None, gpu: int = 0) -> Any:
    """GPU `gpu` to a problem whose stages plan for `nbytes` at their peak, within this process's
    `budget` for it (`check_stop`: see ByteBudget.reserve)."""
    with _gpu_slots_lock:
        memory = _device_memory.setdefault(gpu, ByteBudget())
    return memory.reserve(nbytes, budget, on_wait, check_stop)
