"""The orchestrator drives every call of a session worker and decides from what it sees itself.

For each call it draws a seed from os.urandom, makes the inputs (tasks/trusted.py), flushes the
caches from its own process, writes the inputs into the worker's input buffers, starts its clock,
sends `call`, and stops its clock when the worker's reply says the output is in the output buffer.
So a worker cannot know a call's inputs before the call starts, and cannot make a call look faster
than the orchestrator saw it take (INTEGRITY.md rows 12, 14, 15, 17):

- The worker's claimed time (CUDA events on the GPU, its own clock on the cpu) is the precise one
  and is kept only where the orchestrator's observation bears it out. With a paired reference (the
  default), call by call: a candidate's floor (what the orchestrator saw the call take; on the cpu
  also the worker's CPU time) may exceed the reference's, timed back to back on the same inputs,
  by no more than its claim exceeds the reference's claim, beyond the pairs' own noise
  (`paired_source`), so load that slows both calls of a pair refutes nothing; a floor whose median
  is more than 1.25 times the claims' (plus 0.1 ms) refutes them in any case. Unpaired: the median claim must be at
  least the median of the observed times less the round trip of an empty call (`echo`: every step
  of a call but the model; never more than the trusted baseline worker's). Refuted claims give way
  to that floor for the candidate and its pair alike, so a forged claim gains nothing on the median,
  and the baselines are compared in the same kind of time (tasks/measure.py).
- Verify judges every call's output. Timing judges a sample drawn by the orchestrator as the calls
  go (reservoir sampling, so no call knows whether it will be judged) and always the last call, all
  of them unwatched (the last call is never a watched one); a
  wrong output there is `integrity_violation`/`timed_output`. The number of calls varies. On a GPU
  the clock stops once this process has copied the outputs, and with a paired reference (given the
  same inputs) every timed call's copy is compared with the reference's: a reply sent before the
  kernels finished either waits in that copy or leaves a wrong output in it.
- The worker's processes must be idle between calls: CPU time they use while the orchestrator
  prepares the next call (read from /proc in every gap of verify and a random third of timing's: a thread that finishes
  outputs late, or computes while inputs arrive) is `integrity_violation`/`busy_between_calls`.
- A time below what writing the outputs at the device's peak bandwidth takes is
  `integrity_violation`/`impossible_speed`; every timed attempt gets its `roofline_fraction`
  (tasks/roofline.py).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import secrets
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kforge.config import RunConfig
from tasks import gpus, slots, trace, trusted
from tasks.channel import Conversation, WorkerEnded, conversation
from tasks.harness.protocol import WorkerRequest, failure
from tasks.isolate import Limits, check_stopping, process_tree
from tasks.pool import worker_pool

ECHO_CALLS = 5  # empty calls before the first timed calls; then one before about one in ECHO_SHARE
ECHO_SHARE = 8
SLOW_CALL_S = 0.5  # a call's round trip past this is traced (tasks/trace.py)
JUDGED_TIMED_CALLS = 2  # besides the last one
RECORDED_TIMED_SHARE = 10  # one timed call in this many also records its dispatched ops
SIDE_STREAM_SLACK_MS = 0.002  # a watched call's device work ending this long past its end is left running
BUSY_SHARE = 0.25  # of the time between calls, summed over the session ...
BUSY_MIN_MS = 20.0  # ... and at least this much CPU time in all
CPU_FLUSH_BYTES = 64 << 20
INPUTS_AHEAD_BYTES = 256 << 20
EXITED_MIN_MS = 40.0  # clock ticks are 10 ms: below this, the two counters differ by their rounding
COMPILED_BASELINE = slots.COMPILED_BASELINE_MODE  # the torch.compile baseline's stage on a GPU
WATCHED_GAP_SHARE = 3  # one gap between calls in this many, at random, has the worker's CPU time read
# A paired candidate's claims stand unless, pair by pair, its floor exceeds the reference's by more
# than its claim exceeds the reference's claim, beyond this many standard errors of the median
# excess (from the pairs' own spread, so a busy host widens it) plus a fixed part: what a short
# kernel's host-side launch differs by from torch's (ctypes, Python) is not a forged claim.
PAIRED_Z = 4.0
PAIRED_SLACK_MS = 0.02
PAIRED_SLACK_SHARE = 0.05
# ... and, whatever the pairs' spread, a floor whose median is more than this many times the claims'
# (plus GROSS_SLACK_MS) refutes them: few pairs on a noisy host cannot hide a forged clock (with 3-10
# pairs on 2 cores, a clock running at half speed passed the pairs' test; 2.0 here let it through).
# A claim refuted wrongly costs little: the candidate and its pair then take the same floor.
GROSS_FACTOR = 1.25
GROSS_SLACK_MS = 0.1


class Stop(Exception):
    """Ends a session with this outcome."""

    def __init__(self, outcome: dict[str, Any]):
        super().__init__(outcome.get("error_excerpt"))
        self.outcome = outcome


def _failure(outcome: str, error_class: str, excerpt: str) -> Stop:
    return Stop(failure(outcome, error_class, excerpt))


@dataclass
class Buffers:
    inputs: list[Any]  # this process's views of the worker's input buffers (None: not a tensor)
    outputs: list[Any]
    closers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for close in self.closers:
            close()


@dataclass
class Call:
    seed: int
    claimed_ms: float
    observed_ms: float
    ops: list[str] | None
    inputs: list[Any]
    echo: bool = False
    # cpu: the CPU time the worker used from this call's start to the next step's start (read from
    # /proc by this process while the worker waits): work it does after replying is counted too
    cpu_ms: float | None = None
    # cuda, watched calls: how long the call's device work (any stream) ran past the point the
    # current stream had reached when forward returned, from the profiler's device trace
    device_overrun_ms: float | None = None


@dataclass
class Session:
    talk: Conversation
    runtime: trusted.ProblemRuntime
    buffers: Buffers
    isolation: dict[str, str] | None = None  # the layers the worker reports (tasks/harness/sandbox.py)
    ahead: collections.deque = field(default_factory=collections.deque)  # (seed, inputs) made before
    watched_gap_share: int = WATCHED_GAP_SHARE  # verify, with its few calls, watches every gap
    busy_ns: int = 0
    idle_ns: int = 0
    _replied_at: tuple[float, int] | None = None
    _previous: Call | None = None
    calls: int = 0
    _cpu_mark: int | None = None  # cpu: the worker's CPU ns when the previous step went out
    threads: int = 1  # the worker's compute threads
    samples_on_host: bool = False  # the memory plan's: judged outputs copied to host memory
    # GPU: this process's copy of the outputs, taken inside each call's clock (see `_call`)
    latest: list[Any] = field(default_factory=list)
    candidate_source: str = ""  # what a kernel's name is looked up in (`_check_ops`)
    # seconds spent on the checks, by kind (benchmarks/integrity_overhead.py reports their share)
    check_s: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def spending(self, kind: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.check_s[kind] = self.check_s.get(kind, 0.0) + time.perf_counter() - started


def _limits(stage: str, config: RunConfig, problem_source: str | None = None) -> Limits:
    """A stage's worker limits. Its memory limit makes room for two copies of the problem's
    parameters (the model built on the host, then moved or copied) where this process knows them:
    KernelBench's 2_ShallowWideMLP holds 8.6 GB of weights, more than the default limit."""
    wall_s = config.compile_timeout_s if stage in ("compile", "baseline", COMPILED_BASELINE) else config.run_timeout_s
    on_cpu = config.backend == "cpu"
    memory_mb = config.memory_limit_mb
    known = problem_source and trusted.known_parameter_bytes(
        problem_source, config.backend, config.effective_size_preset()
    )
    if memory_mb is not None and known:
        memory_mb += -(-2 * known // 2**20)
    return Limits(
        wall_s=wall_s,
        cpu_s=int(wall_s * 4) + 10,
        memory_mb=memory_mb if on_cpu else None,
        resident_mb=None if on_cpu else memory_mb,
    )


def _request(mode: str, problem_source: str, candidate_source: str | None, config: RunConfig, model: str):
    return WorkerRequest(
        mode=mode,
        problem_source=problem_source,
        candidate_source=candidate_source,
        backend=config.backend,
        size_preset=config.effective_size_preset(),
        init_seed=config.seeds("init", 1)[0],
        model=model,
        gpu_index=config.gpu_index,
        visible_devices=gpus.worker_binding(
            config.backend, config.gpu_index, config.gpus, os.environ.get("CUDA_VISIBLE_DEVICES")
        ),
    )


@contextlib.contextmanager
def _session(
    stage: str, problem_source: str, candidate_source: str | None, config: RunConfig, calls_ahead: int = 0
) -> Iterator[Session]:
    """A started session worker with its buffers attached; Stop with the outcome when the problem,
    the worker or its set-up fails. On the cpu the inputs of the first `calls_ahead` calls are made
    while the worker starts (at most INPUTS_AHEAD_BYTES of them): this process would only wait.
    Stage `paired`: the reference, timed beside a candidate in the time stage's device slot."""
    model = "reference" if stage in ("baseline", COMPILED_BASELINE, "paired") else "candidate"
    request = _request("session", problem_source, candidate_source, config, model)
    pool = worker_pool(config.effective_worker_pool())
    kernel_cache = Path(config.cache_dir) / "kernels"
    # On the cpu the reference is built (or found kept) before the worker starts: the worker's memory
    # limit needs its size. A GPU backend built it for the memory plan, inside the GPU slot.
    runtime = _runtime(stage, problem_source, config, request) if config.backend == "cpu" else None
    limits = _limits(stage, config, problem_source)
    with conversation(request, limits, kernel_cache, config.threads, pool, stage) as talk:
        runtime = runtime or _runtime(stage, problem_source, config, request)
        started = time.perf_counter()
        ahead = _inputs_ahead(runtime, calls_ahead)
        made = time.perf_counter()
        with trace.span("worker-ready", mode=stage):
            ready = talk.receive()
        if "outcome" in ready:
            raise Stop(_claimed_failure(ready))
        buffers = _attach(talk, runtime)
        session = Session(talk, runtime, buffers, isolation=ready.get("isolation"), ahead=ahead)
        session.candidate_source = candidate_source or ""
        if copies_outputs(runtime.device.type, stage):
            session.latest = [view.clone() for view in buffers.outputs]
        session.threads = config.threads or os.cpu_count() or 1
        if time.perf_counter() - made < 0.001:  # the worker was ready before the inputs were: count them
            session.check_s["inputs"] = made - started
        try:
            yield session
        finally:
            buffers.close()


def copies_outputs(device_type: str, stage: str) -> bool:
    """Whether this process copies a stage's outputs as each call ends (`_call`): on a GPU, in every
    stage, so every round trip holds the same work. A candidate's and its paired reference's (without
    the reference's copy, a 4 GB output's 2.2 ms on an H200 refuted honest claims; with it every timed
    call's output has the reference's to be judged against), and the baselines' too: a candidate
    timed without a partner (a memory plan with the pair off) takes its empty-call floor and its
    observed times' counterpart from the baseline stage, and without the baseline's copy an identity
    candidate on a 6.4 GB output was refuted and got 0.49 of eager. On the cpu the buffers are read
    where the worker left them."""
    return device_type == "cuda"


def _runtime(stage: str, problem_source: str, config: RunConfig, request: WorkerRequest) -> trusted.ProblemRuntime:
    try:
        with trace.span("runtime", mode=stage):
            return trusted.runtime_for(
                problem_source, config.backend, request.size_preset, request.init_seed, config.gpu_index
            )
    except trusted.ReferenceFailed as exc:
        raise _failure("runtime_error", "reference_failed", str(exc)) from None


def _inputs_ahead(runtime: trusted.ProblemRuntime, calls: int) -> collections.deque:
    if runtime.device.type != "cpu" or calls <= 0:  # a GPU makes inputs in microseconds
        return collections.deque()
    count = min(calls, INPUTS_AHEAD_BYTES // max(runtime.input_bytes, 1))
    seeds = [trusted.new_seed() for _ in range(count)]
    return collections.deque((seed, trusted.make_inputs(runtime, seed)) for seed in seeds)


def _claimed_failure(reply: dict[str, Any]) -> dict[str, Any]:
    """A failure the worker reports about itself: believed (it can only cost the candidate)."""
    outcome = reply.get("outcome")
    if outcome not in ("compile_error", "runtime_error", "timeout", "shape_mismatch", "integrity_violation"):
        outcome = "runtime_error"
    return failure(outcome, str(reply.get("error_class"))[:200], str(reply.get("error_excerpt"))[-4000:])


def _attach(talk: Conversation, runtime: trusted.ProblemRuntime) -> Buffers:
    """This process's views of the worker's input and output buffers, as the layout step made them:
    a file in the worker's control directory mapped by both on the cpu, the worker's exported device
    allocations opened here on a GPU."""
    from tasks.harness import buffers as views

    layout = runtime.layout
    message = {**layout.to_message(), "reference_aliases": runtime.reference_aliases}
    if runtime.device.type == "cpu":
        import mmap

        path = talk.control_path / "io.bin"
        input_offsets, output_offsets, total = layout.offsets()
        with open(path, "w+b") as handle:
            handle.truncate(total)
            shared = mmap.mmap(handle.fileno(), total)
        os.chmod(path, 0o666)  # the worker runs as a user of its own
        message["buffer_path"] = str(path)
        reply = talk.ask(message)
        if not reply.get("ok"):
            raise Stop(_claimed_failure(reply))
        return Buffers(
            [None if s is None else views.file_view(shared, o, s) for s, o in zip(layout.inputs, input_offsets)],
            [views.file_view(shared, o, s) for s, o in zip(layout.outputs, output_offsets)],
        )
    from tasks.harness import ipc

    reply = talk.ask(message)
    if not reply.get("ok"):
        raise Stop(_claimed_failure(reply))
    handles = {"inputs": reply.get("inputs"), "outputs": reply.get("outputs")}
    if not all(isinstance(h, list) and len(h) == len(getattr(layout, k)) for k, h in handles.items()):
        raise _failure("integrity_violation", "malformed_reply", "the worker exported the wrong number of buffers")
    mapped = Buffers([], [])
    try:
        for kind, specs in (("inputs", layout.inputs), ("outputs", layout.outputs)):
            for spec, handle in zip(specs, handles[kind]):
                if spec is None:
                    getattr(mapped, kind).append(None)
                    continue
                raw, close = ipc.open_mapping(handle, spec.nbytes, runtime.device)
                mapped.closers.append(close)
                getattr(mapped, kind).append(views.typed(raw, spec))
    except ValueError as exc:
        mapped.close()
        raise _failure("integrity_violation", "malformed_reply", f"the worker's buffers: {exc}") from None
    return mapped


@functools.cache
def _flush_buffer(device_key: str) -> Any:
    import torch

    from tasks.roofline import device_peak, flush_bytes

    device = torch.device(device_key)
    if device.type != "cuda":  # 64 MB as before: a virtual CPU's reported L3 (480 MB here) is the host's
        return torch.empty(CPU_FLUSH_BYTES // 4, dtype=torch.float32)
    peak = device_peak(torch.cuda.get_device_name(device))
    return torch.empty(flush_bytes(peak) // 4, dtype=torch.float32, device=device)


def _flush(device: Any) -> None:
    """Evict the last-level cache from this process: the L2 of a GPU is shared by every context on
    it, the CPU's last-level cache by every core. On a GPU the persisting-L2 lines an access-policy
    window may have set aside are reset first (a plain fill does not evict them)."""
    if device.type == "cuda":
        _reset_persisting_l2()
    _flush_buffer(str(device)).fill_(float(secrets.randbelow(1000)))


def _reset_persisting_l2() -> None:
    with contextlib.suppress(Exception):
        from tasks.harness.nvrtc import driver

        libcuda = driver()
        libcuda.cuCtxResetPersistingL2Cache()
        libcuda.cuCtxSetLimit(0x06, 0)  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE


def _cpu_ns(pid: int) -> int:
    """CPU time used so far by `pid`, its live threads and its descendants (Linux schedstat, ns)."""
    total = 0
    for current in process_tree(pid):
        try:
            for task in os.scandir(f"/proc/{current}/task"):
                with open(f"{task.path}/schedstat") as stat:
                    total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def _next_inputs(session: Session) -> tuple[int, list[Any]]:
    """A fresh seed and the inputs made from it, here (made ahead of time on the cpu)."""
    with session.spending("inputs"):
        if session.ahead:
            return session.ahead.popleft()
        seed = trusted.new_seed()
        return seed, trusted.make_inputs(session.runtime, seed)


def _call(
    session: Session, record: bool = False, echo: bool = False, given: tuple[int, list[Any]] | None = None
) -> Call:
    """One call on fresh inputs (or the `given` seed and inputs: a paired reference gets its
    candidate's), clocked from here. On a GPU the clock stops only once this process holds its own
    copy of the outputs: a worker that replies before its kernels are done has either that wait
    charged (the copy queues behind them) or an unfinished output in the copy, which is what is
    judged (the device does not run two processes' kernels at once, but it may switch between them
    before the worker's last kernel)."""
    import torch

    from tasks.harness import modules

    runtime, buffers = session.runtime, session.buffers
    seed, inputs = 0, []
    if not echo:  # an empty call reads no inputs
        seed, inputs = given if given is not None else _next_inputs(session)
        with session.spending("inputs"):
            for target, value in zip(buffers.inputs, inputs):
                if target is not None:
                    target.copy_(value)
    scalars = {str(i): v for i, v in enumerate(inputs) if not isinstance(v, torch.Tensor)}
    _flush(runtime.device)
    modules.synchronize(runtime.device)
    if session._replied_at is not None:  # this gap between calls is one of the watched ones
        with session.spending("watch"):
            replied_s, replied_ns = session._replied_at
            session.busy_ns += _cpu_ns(session.talk.pid) - replied_ns
            session.idle_ns += int((time.perf_counter() - replied_s) * 1e9)
    step = {"step": "echo"} if echo else {"step": "call", "scalars": scalars, "record": record}
    _account_cpu(session)
    started = time.perf_counter()
    session.talk.send(step)
    reply = session.talk.receive()
    for copy, view in zip(session.latest, buffers.outputs):
        copy.copy_(view)
    if session.latest:
        modules.synchronize(runtime.device)
    ended = time.perf_counter()
    session._replied_at = None
    if secrets.randbelow(session.watched_gap_share) == 0:  # reading /proc costs: a sample of the gaps
        with session.spending("watch"):
            session._replied_at = (ended, _cpu_ns(session.talk.pid))
    session.calls += 1
    if "outcome" in reply:
        raise Stop(_claimed_failure(reply))
    claimed = reply.get("claimed_ms")
    if not _is_duration(claimed):
        raise _failure("integrity_violation", "malformed_reply", f"a call claimed {str(claimed)[:100]} ms")
    ops = reply.get("ops") if record else None
    if record and not (isinstance(ops, list) and all(isinstance(op, str) for op in ops)):
        raise _failure("integrity_violation", "malformed_reply", "a recorded call reported no op list")
    overrun = reply.get("device_overrun_ms") if record else None
    if overrun is not None and not _is_duration(overrun):
        report = f"a recorded call's device overrun was {str(overrun)[:100]}"
        raise _failure("integrity_violation", "malformed_reply", report)
    observed_ms = (ended - started) * 1000
    session._previous = Call(seed, float(claimed), observed_ms, ops, inputs, echo=echo, device_overrun_ms=overrun)
    if ended - started > SLOW_CALL_S:
        trace.record("slow-call", time.time(), ended - started, claimed_ms=float(claimed), echo=echo)
    return session._previous


def _is_duration(value: Any) -> bool:
    """A number of ms the worker reported: not a bool, not NaN, not negative."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _account_cpu(session: Session) -> None:
    """cpu: read the worker's CPU time now, while it waits for its next step, and charge what it
    used since the previous step started to that step (`Call.cpu_ms`)."""
    if session.runtime.device.type != "cpu":
        return
    with session.spending("watch"):
        now_ns = _cpu_ns(session.talk.pid)
    if session._previous is not None and session._cpu_mark is not None:
        session._previous.cpu_ms = (now_ns - session._cpu_mark) / 1e6
    session._cpu_mark = now_ns


def _snapshot(session: Session, call: Call) -> Any:
    """The call's output as the worker left it, copied here, after checking the worker left its
    inputs as they were handed over (INTEGRITY.md row 6)."""
    with session.spending("judge"):
        return _copy_out(session, call)


def _copy_out(session: Session, call: Call) -> Any:
    import torch

    for index, (target, value) in enumerate(zip(session.buffers.inputs, call.inputs)):
        if target is not None and not torch.equal(target, value):
            raise _failure("integrity_violation", "modified_input", f"the candidate wrote into input {index}")
    outputs = session.latest or session.buffers.outputs  # on a GPU: as the call's clock ended
    if session.samples_on_host:
        copies = [view.to("cpu", copy=True) for view in outputs]
    else:
        copies = [view.clone() for view in outputs]
    return _as_output(session, copies)


def _as_output(session: Session, copies: list[Any]) -> Any:
    container = session.runtime.layout.output_container
    if container is None:
        return copies[0]
    return tuple(copies) if container == "tuple" else copies


def _check_ops(session: Session, call: Call, config: RunConfig) -> None:
    from tasks.harness.dispatch import library_calls, library_kernels

    # A watched GPU call's trace without its gate and marker or with a launch whose kernel is missing,
    # where this process's own trace is whole, was stopped or emptied by the candidate: the side-stream
    # check would have nothing to judge
    untraced = call.device_overrun_ms is None and session.runtime.device.type == "cuda"
    if untraced and trusted.device_traces_work(session.runtime.device):
        excerpt = (
            "a watched call's device trace lacked its gate and marker on the current stream or a launched kernel: "
            "ModelNew.forward stopped the profiler, turned its device activity off or replied without its trace; "
            "leave the profiler and the reply to the harness"
        )
        raise _failure("integrity_violation", "device_trace", excerpt)
    # Device work that starts before the current stream reached forward or ends after it passed
    # forward's end ran on a stream not ordered with the current one (INTEGRITY.md rows 2 and 16),
    # whatever its size
    if (overrun := call.device_overrun_ms) is not None and overrun > SIDE_STREAM_SLACK_MS:
        excerpt = (
            f"ModelNew.forward ran device work outside the current stream's span of the call ({overrun:.4f} ms "
            "outside it): order every stream the kernel uses after the current one and make the current one "
            "wait for them"
        )
        raise _failure("integrity_violation", "side_stream", excerpt)
    if config.allow_library_calls:
        return
    reference_ops, ops = set(session.runtime.reference_ops), set(call.ops or [])
    if calls := library_calls(reference_ops, ops):
        names = ", ".join(f"aten::{name}" for name in calls)
        excerpt = f"ModelNew.forward dispatched {names}, which the reference computes (library calls are off)"
        raise _failure("integrity_violation", "reference_op", excerpt)
    if kernels := library_kernels(reference_ops, ops, session.candidate_source):
        excerpt = (
            f"ModelNew.forward ran the library kernel {kernels[0][:200]} for the reference's matrix product or "
            "convolution (library calls are off): write the kernel, or set allow_library_calls"
        )
        raise _failure("integrity_violation", "library_kernel", excerpt)


def _run_stage(
    stage: str,
    body,
    problem_source: str,
    candidate_source: str | None,
    config: RunConfig,
    calls_ahead: int = 0,
    paired: bool = False,
    plan: Any = None,
) -> dict:
    """`body(session)`, or with `paired` `body(session, partner)` where the partner is a trusted
    reference session alive beside the candidate's, as the stage's result (or the outcome that
    stopped it). The device running out of memory in this process is `harness_out_of_memory`."""
    from tasks import memory

    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(gpus.current(config.backend, config.gpu_index))
            stack.enter_context(trace.span("stage", mode=stage))
            session = stack.enter_context(_session(stage, problem_source, candidate_source, config, calls_ahead))
            session.samples_on_host = bool(plan and plan.samples_on_host)
            if paired:
                # the partner gets its candidate's inputs (`_timed_calls`): none made ahead for it
                partner = stack.enter_context(_session("paired", problem_source, None, config))
                result = body(session, partner)
            else:
                result = body(session)
            result["check_s"] = dict(session.check_s)
            # what the stage's time in the slot went to: the checks by kind, and its calls
            trace.record("stage-checks", time.time(), sum(session.check_s.values()), mode=stage, calls=session.calls)
            for kind, seconds in session.check_s.items():
                trace.record(f"check {kind}", time.time(), seconds, mode=stage)
            isolation = session.isolation
    except Stop as stop:
        result = stop.outcome
    except WorkerEnded as ended:
        result = ended.outcome
    except Exception as exc:
        if not memory.is_out_of_memory(exc):
            raise
        result = harness_out_of_memory(stage, exc, plan or memory_plan(problem_source, config))
    else:
        if isinstance(isolation, dict):
            result["isolation"] = {str(k): str(v)[:200] for k, v in isolation.items()}
            result["network_isolated"] = result["isolation"].get("network", "").startswith("ok")
    result["worker_s"] = time.perf_counter() - started
    return result


HARNESS_OUT_OF_MEMORY = "harness_out_of_memory"


def harness_out_of_memory(stage: str, exc: BaseException, plan: Any) -> dict[str, Any]:
    """The outcome of a stage whose device memory ran out in the orchestrator (not the candidate's
    doing: an infrastructure failure, which the stage's task retries)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    planned = plan.describe() if plan is not None else "no plan (the problem's reference did not build)"
    excerpt = (
        f"the orchestrator ran out of device memory in the {stage} stage: {first_line}. This problem: {planned}. "
        "Lower parallel_problems or device_memory_fraction, or free the GPU, and retry the run"
    )
    return failure("runtime_error", HARNESS_OUT_OF_MEMORY, excerpt)


def verify(problem_source: str, candidate_source: str, config: RunConfig) -> dict[str, Any]:
    """`correct` with tolerances and the largest errors, or the first call's failure. Every call's
    output is judged and every call records the ops it dispatched; the number of calls varies."""

    trials = config.correctness_trials + secrets.randbelow(2)

    def body(session: Session) -> dict[str, Any]:
        from tasks.harness.checks import compare_outputs, first_error_stats

        session.watched_gap_share = 1
        stats, atol, rtol = {"max_abs_err": 0.0, "max_rel_err": 0.0}, 0.0, 0.0
        for trial in range(trials):
            call = _call(session, record=True)
            _check_ops(session, call, config)
            actual = _snapshot(session, call)
            with session.spending("judge"):
                expected = trusted.reference_output(session.runtime, call.inputs)
                mismatch, atol, rtol = compare_outputs(expected, actual)
            if mismatch:
                raise _failure(mismatch.outcome, mismatch.error_class, f"trial {trial}: {mismatch.report}")
            trial_stats = first_error_stats(expected, actual)
            stats = {key: max(stats[key], trial_stats[key]) for key in stats}
        _check_idle(session)
        _check_harness(session)
        return {"outcome": "correct", "trials": trials, "atol": atol, "rtol": rtol, **stats}

    return _run_stage("verify", body, problem_source, candidate_source, config, calls_ahead=trials)


def _echo_ms(echoes: list[Call]) -> float:
    """The median of empty calls' round trips. An empty call runs every step of a call but the
    model, between the timed calls, so under the same load: what an honest call takes beyond its
    claim is as often above it as below, and a forged claim gains nothing on the median. (The p90
    left a forged claim the echo's spread: 2.2x on a loaded 2-core machine.)"""
    return statistics.median(echo.observed_ms for echo in echoes)


def _timed_calls(
    session: Session, config: RunConfig, judge: bool, partner: Session | None = None
) -> tuple[list[Call], list[Call], list, list[Call], list[Call]]:
    """Warm-up, then timed calls until min_timed_runs are done and the budget is spent (or
    max_timed_runs), with an empty call (echo) before about one in ECHO_SHARE of them and before the
    first ECHO_CALLS; returns (timed calls, echo round trips, judged sample, and the partner's timed
    and echo calls). With `judge`, the sample is a reservoir sample of the timed calls' outputs and
    the last one's, as (call index, call, output), and one call in RECORDED_TIMED_SHARE on average
    records its ops (never the last: a stage whose ending call was watched makes one more).

    A `partner` session (the trusted reference) gets a call of the same kind beside each of
    `session`'s, in alternating order (ABBA): both are timed under the same conditions, whatever the
    machine does meanwhile, so their ratio holds on a busy host."""
    turn = [0]

    def paired(echo: bool = False, index: int | None = None) -> Call:
        """A call on the session and, if there is one, on the partner with the same inputs, the
        order alternating. On a GPU the two outputs of a timed call (`index`) are compared: every
        timed call is judged against the reference's output, not only the sample."""
        turn[0] += 1
        if partner is None:
            return _call(session, echo=echo)
        given = None if echo else _next_inputs(session)
        if turn[0] % 4 in (1, 0):  # A B B A A B B A ...
            call = _call(session, echo=echo, given=given)
            partner_calls.append(_call(partner, echo=echo, given=given))
        else:
            partner_calls.append(_call(partner, echo=echo, given=given))
            call = _call(session, echo=echo, given=given)
        partner_calls[-1].inputs = []  # a partner's outputs are not judged: its inputs can go now
        if index is not None and session.latest and partner.latest:
            _judge_against_partner(session, partner, index)
        return call

    partner_calls: list[Call] = []
    for _ in range(config.warmup_runs + secrets.randbelow(3)):
        paired()
    partner_calls.clear()
    timed: list[Call] = []
    echoes: list[Call] = []
    sample: list[tuple[int, Call, Any]] = []
    spent_ms = 0.0
    counted_before = _all_cpu(session)
    partner_before = _all_cpu(partner) if partner else None
    finishing = False  # the call that would have ended the stage was watched: one more ends it
    for index in range(config.max_timed_runs):
        if len(echoes) < ECHO_CALLS or secrets.randbelow(ECHO_SHARE) == 0:
            with session.spending("echo"):
                echoes.append(paired(echo=True))
        record = (
            judge
            and not finishing
            and index < config.max_timed_runs - 1
            and secrets.randbelow(RECORDED_TIMED_SHARE) == 0
        )
        if record:  # a watched call is not timed, and has no partner
            with session.spending("watched_calls"):
                call = _call(session, record=True)
            _check_ops(session, call, config)
        else:
            call = paired(index=index) if judge else paired()
            timed.append(call)
        spent_ms += call.claimed_ms
        last = (
            finishing
            or index == config.max_timed_runs - 1
            or (len(timed) >= config.min_timed_runs and spent_ms >= config.timing_budget_s * 1000)
        )
        if last and record:
            finishing, last = True, False
        # The sample is of timed calls only, and always holds the last: a candidate that computes
        # only while watched (its flags differ then) is caught whichever calls were watched
        if judge and not record:
            if last:
                sample.append((index, call, _snapshot(session, call)))
            elif len(sample) < JUDGED_TIMED_CALLS:
                sample.append((index, call, _snapshot(session, call)))
            elif (slot := secrets.randbelow(len(timed))) < JUDGED_TIMED_CALLS:
                sample[slot] = (index, call, _snapshot(session, call))
        call.inputs = []  # judged from its seed: 100 calls' inputs of a 6 GB problem would not fit
        if last:
            break
    _account_cpu(session)  # the last call's CPU time, up to now
    _charge_exited_threads(session, counted_before, timed, len(timed) + len(echoes))
    partner_timed = [c for c in partner_calls if not c.echo]
    partner_echoes = [c for c in partner_calls if c.echo]
    if partner is not None:
        _account_cpu(partner)
        _charge_exited_threads(partner, partner_before, partner_timed, len(partner_calls))
    return timed, echoes, sample, partner_timed, partner_echoes


def _judge_against_partner(session: Session, partner: Session, index: int) -> None:
    """The candidate's output of timed call `index` as this process copied it when the call's clock
    stopped, against the paired reference's on the same inputs."""
    from tasks.harness.checks import compare_outputs

    with session.spending("judge"):
        mismatch, _, _ = compare_outputs(_as_output(partner, partner.latest), _as_output(session, session.latest))
    if mismatch:
        excerpt = f"the output of timed call {index}, as it stood when the call returned, is wrong: {mismatch.report}"
        raise _failure("integrity_violation", "timed_output", excerpt)


def _all_cpu(session: Session) -> tuple[float, int] | None:
    """cpu: (the worker's CPU ms from /proc/<pid>/stat, exited threads and reaped children included,
    in clock ticks; its live threads' CPU ns from schedstat), or None on a GPU."""
    if session.runtime.device.type != "cpu":
        return None
    with session.spending("watch"):
        return _stat_cpu_ms(session.talk.pid), _cpu_ns(session.talk.pid)


def _stat_cpu_ms(pid: int) -> float:
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    total = 0
    for current in process_tree(pid):
        try:
            with open(f"/proc/{current}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue
    return total * tick_ms


def _charge_exited_threads(session: Session, before: tuple[float, int] | None, timed: list[Call], calls: int) -> None:
    """CPU time of threads that ended during the timed calls is gone from the live threads' schedstat
    that `Call.cpu_ms` reads (a thread started per call, finishing the output after the reply); the
    process's own counters keep it. Past EXITED_MIN_MS (a few clock ticks), it is shared out over
    the calls, so the CPU floor holds it."""
    after = _all_cpu(session)
    if before is None or after is None or not calls:
        return
    exited_ms = (after[0] - before[0]) - (after[1] - before[1]) / 1e6
    if exited_ms > EXITED_MIN_MS:
        for call in timed:
            if call.cpu_ms is not None:
                call.cpu_ms += exited_ms / calls


def _expected_calls(config: RunConfig) -> int:
    """The calls a timing session makes at most (warm-up, timed and watched ones)."""
    return config.warmup_runs + 2 + config.max_timed_runs


def summarize(
    calls: list[Call], echo_ms: float, echo_cpu_ms: float | None = None, threads: int = 1, source: str | None = None
) -> dict:
    """The median of the claimed times, unless a floor the orchestrator measured itself has a higher
    median: then the claims are not borne out and that floor's times are the result. The floors:
    what the orchestrator saw each call take less `echo_ms` (an empty call's round trip), and on the
    cpu the worker's CPU time from the call's start to the next one's, less an empty call's
    (`echo_cpu_ms`), over its `threads` (CPU time does not grow when a busy machine delays the
    worker, and work done after the reply is in it). Medians first: a per-call maximum would add
    every call's host noise to an honest kernel of tens of microseconds. `timing_source` says which;
    a given `source` is used as it is (a paired reference is timed the way its candidate was)."""
    candidates = {
        "claimed": sorted(c.claimed_ms for c in calls),
        "observed": sorted(max(0.0, c.observed_ms - echo_ms) for c in calls),
    }
    if echo_cpu_ms is not None and all(c.cpu_ms is not None for c in calls):
        candidates["cpu"] = sorted(max(0.0, c.cpu_ms - echo_cpu_ms) / threads for c in calls)
    medians = {name: statistics.median(values) for name, values in candidates.items()}
    if source not in candidates:  # `source` given: a paired reference takes its candidate's kind of time
        source = "claimed" if medians["claimed"] >= max(medians.values()) else max(medians, key=medians.get)
    times = candidates[source]
    return {
        "median_ms": statistics.median(times),
        "p10_ms": _percentile(times, 0.1),
        "p90_ms": _percentile(times, 0.9),
        "runs": len(times),
        "claimed_ms": medians["claimed"],
        "observed_ms": medians["observed"],
        "cpu_ms": medians.get("cpu"),
        "timing_source": source,
    }


def paired_source(
    calls: list[Call],
    reference_calls: list[Call],
    threads: int = 1,
    echo_ms: float | None = None,
    echo_cpu_ms: float | None = None,
) -> str:
    """ "claimed" where the candidate's claims are borne out against its paired reference, else the
    floor ("observed", or "cpu" where that is further off) that refutes them.

    Call i of each ran with the same inputs, back to back (ABBA). For each pair and floor, the excess
    is how much more the candidate's floor exceeds the reference's than its claim exceeds the
    reference's claim: about zero for an honest candidate however slow the host is (load moves
    both calls of a pair alike, the echo cancels), the forged part of its claim otherwise. The
    claims are refuted when the median excess is beyond PAIRED_Z standard errors (from the excesses'
    own spread) plus a slack for host-side launch differences, or where a floor's median (less the
    empty call's `echo_ms` / `echo_cpu_ms`) is more than GROSS_FACTOR times the claims' (a backstop for
    few, noisy pairs)."""
    pairs = list(zip(calls, reference_calls))
    floors = {"observed": lambda c: c.observed_ms}
    offsets = {"observed": echo_ms}
    if all(c.cpu_ms is not None for pair in pairs for c in pair):
        floors["cpu"] = lambda c: c.cpu_ms / threads
        offsets["cpu"] = None if echo_cpu_ms is None else echo_cpu_ms / threads
    reference_claim = statistics.median(r.claimed_ms for _, r in pairs)
    claim = statistics.median(c.claimed_ms for c, _ in pairs)
    slack = PAIRED_SLACK_MS + PAIRED_SLACK_SHARE * reference_claim
    beyond: dict[str, float] = {}
    for name, floor in floors.items():
        excess = [(floor(c) - floor(r)) - (c.claimed_ms - r.claimed_ms) for c, r in pairs]
        middle = statistics.median(excess)
        spread = statistics.median(abs(e - middle) for e in excess) * 1.4826  # a robust standard deviation
        standard_error = 1.2533 * spread / max(1, len(excess)) ** 0.5  # of a median
        over = middle - (PAIRED_Z * standard_error + slack)
        if offsets[name] is not None:
            floor_median = statistics.median(max(0.0, floor(c) - offsets[name]) for c, _ in pairs)
            over = max(over, floor_median - (GROSS_FACTOR * claim + GROSS_SLACK_MS))
        if over > 0:
            beyond[name] = over
    return max(beyond, key=beyond.get) if beyond else "claimed"


def _echo_cpu_ms(echoes: list[Call]) -> float | None:
    used = [echo.cpu_ms for echo in echoes if echo.cpu_ms is not None]
    return statistics.median(used) if used else None


def _percentile(sorted_values: list[float], fraction: float) -> float:
    position = fraction * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _check_harness(session: Session) -> None:
    """The worker's own look at whether the candidate replaced harness or torch functions (a first
    line, INTEGRITY.md row 9: nothing it could patch decides anything here)."""
    reply = session.talk.ask({"step": "check"})
    if "outcome" in reply:
        raise Stop(_claimed_failure(reply))


def _check_idle(session: Session) -> None:
    """Work outside the calls: the CPU time the worker used in the watched gaps."""
    busy_ms, idle_ms = session.busy_ns / 1e6, session.idle_ns / 1e6
    if busy_ms > max(BUSY_MIN_MS, BUSY_SHARE * idle_ms):
        excerpt = (
            f"the worker used {busy_ms:.1f} ms of CPU time in the {idle_ms:.1f} ms between its calls: work that "
            "goes on after a call reported its output done, or starts before the next call, escapes the timing"
        )
        raise _failure("integrity_violation", "busy_between_calls", excerpt)


def time_candidate(
    problem_source: str,
    candidate_source: str,
    config: RunConfig,
    trusted_echo_ms: float | None = None,
    trusted_echo_cpu_ms: float | None = None,
) -> dict[str, Any]:
    """The candidate's median/p10/p90 time (see `summarize`) with its judged sample, or the outcome
    that stopped it."""

    def body(session: Session, partner: Session | None = None) -> dict[str, Any]:
        from tasks.harness.checks import compare_outputs

        timed, echoes, sample, reference_timed, reference_echoes = _timed_calls(session, config, True, partner)
        # A candidate can slow its own empty calls, never the trusted reference's: with a paired
        # reference, its empty calls (made beside the candidate's, under the same load); otherwise the
        # baseline stage's (another moment: on a host whose load changes, a floor biased upwards).
        trusted_echoes = [_echo_ms(reference_echoes)] if reference_echoes else []
        if trusted_echo_ms is not None and not reference_echoes:
            trusted_echoes.append(trusted_echo_ms)
        echo_ms = min([_echo_ms(echoes), *trusted_echoes])
        _check_idle(session)
        _check_harness(session)
        for index, call, actual in sample:
            with session.spending("judge"):
                inputs = trusted.make_inputs(session.runtime, call.seed)
                expected = trusted.reference_output(session.runtime, inputs)
                del inputs
                if session.samples_on_host:
                    expected = _to_host(expected)
                mismatch, _, _ = compare_outputs(expected, actual)
            if mismatch:
                excerpt = f"the output of timed call {index} is wrong: {mismatch.report}"
                raise _failure("integrity_violation", "timed_output", excerpt)
        echo_cpu_ms = _echo_cpu_ms(echoes)
        trusted_cpu = _echo_cpu_ms(reference_echoes) if reference_echoes else trusted_echo_cpu_ms
        if echo_cpu_ms is not None and trusted_cpu is not None:
            echo_cpu_ms = min(echo_cpu_ms, trusted_cpu)
        summary = summarize(timed, echo_ms, echo_cpu_ms, session.threads)
        paired = {}
        if reference_timed:  # the same floors for both: an identical model gets an identical time
            source = paired_source(timed, reference_timed, session.threads, echo_ms, echo_cpu_ms)
            summary = summarize(timed, echo_ms, echo_cpu_ms, session.threads, source)
            reference = summarize(reference_timed, echo_ms, echo_cpu_ms, session.threads, source)
            paired = {
                "paired_eager_ms": reference["median_ms"],
                "paired_eager_p10_ms": reference["p10_ms"],
                "paired_eager_p90_ms": reference["p90_ms"],
            }
        result = {
            "outcome": "correct",
            "runtime_ms": summary["median_ms"],
            "runtime_p10_ms": summary["p10_ms"],
            "runtime_p90_ms": summary["p90_ms"],
            "timed_runs": summary["runs"],
            "claimed_ms": summary["claimed_ms"],
            "observed_ms": summary["observed_ms"],
            "cpu_floor_ms": summary["cpu_ms"],
            "timing_source": summary["timing_source"],
            "echo_ms": echo_ms,
            "judged_calls": sorted(index for index, _, _ in sample),
            "judged_seeds": [str(call.seed) for _, call, _ in sorted(sample, key=lambda s: s[0])],
            **paired,
        }
        return {**result, **_roofline(session.runtime, summary["median_ms"])}

    plan = memory_plan(problem_source, config)
    paired = config.paired_reference and (plan is None or plan.paired)
    calls = _expected_calls(config)
    return _run_stage("time", body, problem_source, candidate_source, config, calls, paired=paired, plan=plan)


def memory_plan(problem_source: str, config: RunConfig) -> Any:
    """The problem's memory plan on this device (tasks/memory.py); None where its reference fails
    (the session reports that) or on the cpu."""
    from tasks import memory

    if config.backend == "cpu":
        return None
    try:
        # inside the GPU slot: building the runtime runs the reference, beside no one's timing
        with (
            slots.device_slot(config.backend, "verify", config.gpu_index),
            gpus.current(config.backend, config.gpu_index),
        ):
            runtime = trusted.runtime_for(
                problem_source,
                config.backend,
                config.effective_size_preset(),
                config.seeds("init", 1)[0],
                config.gpu_index,
            )
    except trusted.ReferenceFailed:
        return None
    except Exception as exc:
        if memory.is_out_of_memory(exc):  # the stage meets it again and reports it
            return None
        raise
    budget = memory.device_budget(runtime.device, config.device_memory_fraction)
    parameters = memory.parameter_bytes(runtime.reference)
    return memory.plan(runtime.input_bytes, runtime.output_bytes, parameters, budget, config.paired_reference)


@contextlib.contextmanager
def device_admission(problem_source: str, config: RunConfig, on_wait: Any = None) -> Iterator[Any]:
    """The problem's planned device bytes held while the block runs (tasks/slots.py `admitted`), so
    problems in flight together fit the device; yields the plan (None, admitting at once, on the cpu
    or where the reference fails)."""
    from tasks import memory

    plan = memory_plan(problem_source, config)
    if plan is None:
        yield None
        return
    import torch

    from tasks.harness import modules

    device = torch.device(modules.BACKEND_DEVICES[config.backend], config.gpu_index)
    budget = memory.admission_budget(device, config.device_memory_fraction) or plan.stage_bytes
    with slots.admitted(plan.stage_bytes, budget, on_wait, check_stopping, config.gpu_index):
        yield plan


def _to_host(output: Any) -> Any:
    if isinstance(output, (tuple, list)):
        return type(output)(t.to("cpu") for t in output)
    return output.to("cpu")


def _roofline(runtime: trusted.ProblemRuntime, runtime_ms: float) -> dict[str, Any]:
    from tasks import roofline

    name = _device_name(str(runtime.device))
    bounds = roofline.bounds(roofline.device_peak(name), runtime.input_bytes, runtime.output_bytes, runtime.flops)
    verdict, fraction = roofline.assess(runtime_ms, bounds)
    if verdict == "impossible":
        excerpt = (
            f"{runtime_ms:.4g} ms is less than writing the {runtime.output_bytes} output bytes at the peak "
            f"bandwidth of {name} takes ({bounds.write_floor_ms:.4g} ms)"
        )
        raise _failure("integrity_violation", "impossible_speed", excerpt)
    # the fewest bytes a call can move (its inputs read, its outputs written): a profile's DRAM traffic against it
    min_bytes = runtime.input_bytes + runtime.output_bytes
    return {"roofline_fraction": fraction, "roofline_suspect": verdict == "suspect", "min_bytes": min_bytes}


@functools.cache
def _device_name(device_key: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device_key)) if device_key.startswith("cuda") else "cpu"


def time_baselines(problem_source: str, config: RunConfig) -> dict[str, Any]:
    """The reference timed eagerly (briefly when candidates get a paired reference) and under
    torch.compile, with the same calls as a candidate's, in trusted workers; and `echo_ms`, its
    empty call's round trip, which bounds candidates' claims. A torch.compile that fails is recorded
    (`torch_compile_error`) beside the eager figures."""

    # With a paired reference every candidate's time stage times the reference again beside it, and
    # that pair decides speedup_eager: here a short eager timing is enough (a record of the problem,
    # and the fallback when a candidate's stage cannot pair). The torch.compile timing stays full.
    plan = memory_plan(problem_source, config)
    paired = config.paired_reference and (plan is None or plan.paired)
    eager_config = config.model_copy(update={"max_timed_runs": config.min_timed_runs}) if paired else config

    def eager(session: Session) -> dict[str, Any]:
        timed, echoes, _, _, _ = _timed_calls(session, eager_config, judge=False)
        echo_ms = _echo_ms(echoes)
        # Trusted code: its claims stand; the floors are kept for a candidate timed by one of them.
        summary = summarize(timed, echo_ms, _echo_cpu_ms(echoes), session.threads, "claimed")
        return {
            "outcome": "correct",
            "eager_ms": summary["median_ms"],
            "eager_p10_ms": summary["p10_ms"],
            "eager_p90_ms": summary["p90_ms"],
            "eager_observed_ms": summary["observed_ms"],
            "eager_cpu_ms": summary["cpu_ms"],
            "compile_ms": None,
            "torch_compile_error": None,
            "echo_ms": echo_ms,
            "echo_cpu_ms": _echo_cpu_ms(echoes),
        }

    def compiled(session: Session) -> dict[str, Any]:
        reply = session.talk.ask({"step": "compile"})
        if "outcome" in reply:
            return {"outcome": "correct", "torch_compile_error": str(reply.get("error_excerpt"))[-4000:]}
        # torch.compile compiles on the first call (seconds to minutes of CPU): on a GPU that call
        # runs outside the GPU slot, so other problems' stages are not held up by it
        _call(session)
        with slots.timing_after_setup(config.backend, config.gpu_index):
            timed, echoes, _, _, _ = _timed_calls(session, config, judge=False)
        summary = summarize(timed, _echo_ms(echoes), _echo_cpu_ms(echoes), session.threads, "claimed")
        return {
            "outcome": "correct",
            "compile_ms": summary["median_ms"],
            "compile_observed_ms": summary["observed_ms"],
            "compile_cpu_ms": summary["cpu_ms"],
        }

    result = _run_stage("baseline", eager, problem_source, None, config, _expected_calls(config))
    if config.torch_compile_baseline and result.get("outcome") == "correct":
        # on the cpu the cores are the device: the compile stays inside the timing slot there
        stage = "baseline" if config.backend == "cpu" else COMPILED_BASELINE
        under_compile = _run_stage(stage, compiled, problem_source, None, config, _expected_calls(config) + 1)
        if under_compile.get("outcome") == "correct":
            result.update({k: v for k, v in under_compile.items() if k not in ("outcome", "check_s", "worker_s")})
        else:
            result["torch_compile_error"] = str(under_compile.get("error_excerpt"))[-4000:]
        for kind, seconds in (under_compile.get("check_s") or {}).items():
            result["check_s"][kind] = result["check_s"].get(kind, 0.0) + seconds
        result["worker_s"] += under_compile.get("worker_s", 0.0)
    return result
