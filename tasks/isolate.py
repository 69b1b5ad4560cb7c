"""Run one evaluation request in a fresh, limited worker process and read back its outcome.

The untrusted candidate never runs in this (the orchestrating) process. Each worker gets its own
temporary working directory, its own process session (so a hang is killed with all its children),
CPU-time and address-space limits, and an environment stripped of everything but what compilers
and torch need (no API keys). The worker applies its CPU and memory limits to itself before it
touches candidate code (no preexec_fn: this process runs Prefect's threads). A crash, hang or
memory blow-up becomes an outcome with the tail of the worker's log; only a failure to start the
worker at all is an infrastructure error.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kforge.results import OUTCOMES
from tasks import slots
from tasks.harness import sandbox
from tasks.harness.protocol import WorkerRequest, failure

if TYPE_CHECKING:
    from tasks.pool import WorkerPool

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LOG_TAIL_CHARS = 4000
COLLECT_BYTES = 16 << 20  # of each file a result carries back from the control directory (`collect`)
# Passed through to the worker; everything else (API keys, cloud credentials) stays behind.
ENV_ALLOWED = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "KFORGE_CUDA_ARCH",
    "KFORGE_INLINE_BUILD",
    "CC",
    "CXX",
    "VIRTUAL_ENV",
    "TRITON_CACHE_DIR",
    "NVIDIA_VISIBLE_DEVICES",
)


def scratch_root() -> str | None:
    """/dev/shm where it has room (memory, not disk: outputs handed from workers to the parent reach
    hundreds of MB per candidate), else None, the default temporary directory."""
    shm = Path("/dev/shm")
    try:
        return str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > 8 << 30 else None
    except OSError:
        return None


class InfrastructureError(Exception):
    """The worker could not be run at all (not the candidate's fault); worth retrying."""


class Stopping(Exception):
    """kforge is stopping (SIGTERM, Ctrl-C): the stage in flight did not finish and records nothing."""


# Every worker process alive, so that a run told to stop ends the stages in flight at once instead of
# waiting for them (the Prefect runner cannot leave while its threads still run a stage).
_live: set[subprocess.Popen] = set()
_uids: dict[int, int] = {}  # a live worker's pid -> its user id (tasks/harness/sandbox.py `next_uid`)
_live_lock = threading.Lock()
_stopping = threading.Event()
STOPPING = "kforge is stopping (a termination signal): the stage did not finish; `kforge retry RUN_ID` redoes it"


def stop_workers() -> None:
    """Kill every live worker and start no new one: the stages in flight raise `Stopping`."""
    _stopping.set()
    with _live_lock:
        live = list(_live)
    for process in live:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)


def resume_workers() -> None:
    """A new run in this process (a notebook after Ctrl-C, a long-lived Prefect process): workers start again."""
    _stopping.clear()


def check_stopping() -> None:
    """Raise `Stopping` once stop_workers() ran: a result that came back then is the kill's, not the candidate's."""
    if _stopping.is_set():
        raise Stopping(STOPPING)


@dataclass(frozen=True)
class Limits:
    wall_s: float = 120.0
    cpu_s: int = 600
    memory_mb: int | None = 8192  # address space; None where a CUDA context's reservations forbid it
    file_mb: int | None = 4096  # largest file the worker may write (outputs, kernels): the disk stays usable
    # Resident memory of the worker and its children, checked by the parent every RESIDENT_CHECK_S:
    # the limit GPU workers get, whose CUDA context rules out an address-space limit.
    resident_mb: int | None = None


def _worker_env(kernel_cache: Path, threads: int | None, visible_devices: str | None = None) -> dict[str, str]:
    env = {key: os.environ[key] for key in ENV_ALLOWED if key in os.environ}
    if visible_devices is not None:  # the worker's one GPU (tasks/gpus.py): its cuda:0
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env["KFORGE_KERNEL_CACHE"] = str(kernel_cache)
    env["TORCH_EXTENSIONS_DIR"] = str(kernel_cache / "torch_extensions")
    # torch.compile baselines reuse inductor's cache across workers and runs (25 s -> 7 s on 2 cores)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(kernel_cache / "inductor")
    # Triton's own cache too: a sandboxed worker's HOME is its working directory (tasks/harness/sandbox.py)
    env.setdefault("TRITON_CACHE_DIR", str(kernel_cache / "triton"))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    # OpenMP threads sleep as soon as a parallel region ends instead of spinning: a worker is idle
    # between calls, which the orchestrator checks (tasks/drive.py), and so is a baseline's.
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env["KINETO_LOG_LEVEL"] = "6"  # the op recording of watched calls: no profiler lines in the log
    # CUPTI torn down when a watched call's trace ends: left subscribed (kineto's default), it slows
    # every later launch, and launch-bound problems' timed calls with it (ResNet18 0.61x on an H200).
    # TEARDOWN_CUPTI=0 in kforge's environment keeps it subscribed (for a side-by-side run).
    env["TEARDOWN_CUPTI"] = "0" if os.environ.get("TEARDOWN_CUPTI") == "0" else "1"
    return env


def _log_tail(log_path: Path) -> str:
    try:
        text = log_path.read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace")
    except OSError:
        return ""
    return text


def _read_result(result_path: Path) -> dict[str, Any] | None:
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("outcome") not in OUTCOMES:
        return None
    return result


def _outcome_from_exit(returncode: int, log: str, limits: Limits) -> dict[str, Any]:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        if name == "SIGXCPU":
            return failure("timeout", "cpu_time_limit", f"exceeded the CPU-time limit of {limits.cpu_s} s\n{log}")
        return failure("runtime_error", name, f"worker killed by {name}\n{log}")
    return failure("runtime_error", "no_result", f"worker exited with code {returncode} without a valid result\n{log}")


@dataclass
class _Worker:
    """A started worker process with its own control and working directories."""

    process: subprocess.Popen
    control: tempfile.TemporaryDirectory
    work: tempfile.TemporaryDirectory
    log_file: Any

    @property
    def control_path(self) -> Path:
        return Path(self.control.name)


def _start_worker(
    argv: list[str], env: dict[str, str], stdin: int, request_json: str | None = None, wrapper: Sequence[str] = ()
) -> _Worker:
    """Start `python -m tasks.harness.worker ARGV` ({control} in ARGV names its control directory),
    with `request_json` written there first if given, under `wrapper` (an argv prefix run inside
    the sandbox: ncu, tasks/profile.py; {control} in it too)."""
    check_stopping()
    sandbox_env: dict[str, str] = {}
    try:
        control = tempfile.TemporaryDirectory(prefix="kforge-ctl-", dir=scratch_root())
        work = tempfile.TemporaryDirectory(prefix="kforge-run-")
        if request_json is not None:
            (Path(control.name) / "request.json").write_text(request_json)
        log_file = open(Path(control.name) / "worker.log", "wb")
        # OS-level isolation (tasks/harness/sandbox.py): namespaces, a user of its own that owns these two
        # directories, and a private /tmp and /dev/shm in which they alone stay visible.
        launcher, sandbox_env = sandbox.worker_launch([Path(control.name), Path(work.name)], Path(work.name), env)
        process = subprocess.Popen(
            [
                *launcher,
                *[a.replace("{control}", control.name) for a in wrapper],
                sys.executable,
                "-m",
                "tasks.harness.worker",
                *[a.replace("{control}", control.name) for a in argv],
            ],
            cwd=work.name,
            env={**env, **sandbox_env},
            stdin=stdin,
            stdout=subprocess.PIPE,  # the reply pipe of a session (tasks/channel.py)
            stderr=log_file,
            start_new_session=True,
        )
    except OSError as exc:
        if uid := sandbox_env.get(sandbox.ENV_UID):  # picked for a worker that never started
            sandbox.release_uid(int(uid))
        raise InfrastructureError(f"cannot start the evaluation worker: {exc}") from exc
    with _live_lock:
        _live.add(process)
        if uid := sandbox_env.get(sandbox.ENV_UID):
            _uids[process.pid] = int(uid)
    if _stopping.is_set():  # stop_workers() ran while this one started
        _kill_session(process)
    return _Worker(process, control, work, log_file)


def _close(worker: _Worker) -> None:
    _kill_session(worker.process)
    worker.log_file.close()
    worker.control.cleanup()
    worker.work.cleanup()


RESIDENT_CHECK_S = 0.1


def run_worker(
    request: WorkerRequest | dict[str, Any],
    limits: Limits,
    kernel_cache: Path,
    threads: int | None = None,
    pool: WorkerPool | None = None,
    wrapper: Sequence[str] = (),
    collect: Sequence[str] = (),
) -> dict[str, Any]:
    """Run a one-result `request` (the compile or profile mode, see tasks.harness.worker) in a
    process of its own, started now or taken from `pool` (never under a `wrapper`, see
    _start_worker); return the outcome dict, always with `outcome`, plus `worker_s` (wall time from
    the request to the worker's end) and, with `collect`, "collected": the text of those files of
    the control directory, by name (the ones the run left)."""
    if isinstance(request, dict):
        request = WorkerRequest(**request)
    kernel_cache.mkdir(parents=True, exist_ok=True)
    env = _worker_env(kernel_cache, threads, request.visible_devices)
    warm_device = "cuda" if request.backend in ("cuda", "triton") else "cpu"
    limits_for_worker = {"cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb, "file_mb": limits.file_mb}
    nonce = secrets.token_hex(16)
    request_json = replace(request, threads=threads, limits=limits_for_worker, nonce=nonce).to_json()
    with slots.device_slot(request.backend, request.mode, request.gpu_index):
        start = time.perf_counter()
        waiting = pool is not None and not wrapper
        if waiting:
            worker = pool.take(env, warm_device, refill_now=True)
            (worker.control_path / "request.json").write_text(request_json)
        else:
            argv = ["{control}/request.json", "{control}/result.json"]
            worker = _start_worker(argv, env, subprocess.DEVNULL, request_json, wrapper)
        try:
            result = _run_request(worker, limits, start, waiting=waiting, nonce=nonce)
            if collect:
                result["collected"] = _collected(worker.control_path, collect)
        finally:
            with _live_lock:
                _live.discard(worker.process)
            worker.control.cleanup()
            worker.work.cleanup()
    check_stopping()
    return result


def _collected(control: Path, names: Sequence[str]) -> dict[str, str]:
    texts = {}
    for name in names:
        with contextlib.suppress(OSError):
            with open(control / name, "rb") as handle:
                texts[name] = handle.read(COLLECT_BYTES).decode(errors="replace")
    return texts


def _run_request(worker: _Worker, limits: Limits, start: float, waiting: bool, nonce: str) -> dict[str, Any]:
    """Let the worker go (a waiting one reads its request on "go"), wait for it, read its result:
    a result without this request's nonce was written by the candidate, not by the harness."""
    result_path = worker.control_path / "result.json"
    if waiting:
        try:
            worker.process.stdin.write(b"go\n")
            worker.process.stdin.close()
        except OSError:
            pass  # it died while waiting: read as a failure below
    returncode, timed_out, over_mb = _wait(worker.process, None, start + limits.wall_s, limits.resident_mb)
    try:
        if over_mb is not None:
            _kill_session(worker.process)
        log = _log_tail(worker.control_path / "worker.log")
        if timed_out:
            result = failure("timeout", "wall_time_limit", f"no result after {limits.wall_s:g} s\n{log}")
        elif over_mb is not None:
            result = failure(
                "runtime_error",
                "out_of_memory",
                f"killed at {over_mb} MB resident, over the limit of {limits.resident_mb} MB\n{log}",
            )
        else:
            result = _read_result(result_path)
            if result is not None and result.pop("nonce", None) != nonce:
                result = failure(
                    "integrity_violation",
                    "forged_result",
                    "the result file does not carry this request's nonce: the candidate wrote it\n" + log,
                )
            result = result or _outcome_from_exit(returncode if returncode is not None else 0, log, limits)
    finally:
        _kill_session(worker.process)
        worker.log_file.close()
    result["worker_s"] = time.perf_counter() - start
    return result


def _wait(
    process: subprocess.Popen, result_path: Path | None, deadline: float, resident_mb: int | None
) -> tuple[int | None, bool, int | None]:
    """(exit code or None, timed out, resident MB when over `resident_mb`): wait until the process
    exits or, where `result_path` is given, until that file appears (a holding worker stays alive
    after writing it); with `resident_mb`, stop as soon as the worker's processes hold more memory."""
    if result_path is None and resident_mb is None:
        try:
            return process.wait(timeout=max(0.0, deadline - time.perf_counter())), False, None
        except subprocess.TimeoutExpired:
            return None, True, None
    delay, next_check = 0.0005, 0.0
    while (returncode := process.poll()) is None:
        if result_path is not None and result_path.exists():
            return None, False, None
        now = time.perf_counter()
        if now >= deadline:
            return None, True, None
        if resident_mb is not None and now >= next_check:
            next_check = now + RESIDENT_CHECK_S
            if (in_use := _resident_mb(process.pid)) > resident_mb:
                return None, False, in_use
        time.sleep(delay)
        delay = min(delay * 2, 0.005)
    return returncode, False, None


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants that are alive now (Linux /proc; just `pid` where unreadable)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        if current in found:
            continue
        found.append(current)
        try:
            for task in os.scandir(f"/proc/{current}/task"):
                with open(f"{task.path}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
        except (OSError, ValueError):
            continue  # gone meanwhile, or no such files on this OS
    return found


def _resident_mb(pid: int) -> int:
    """Resident memory of `pid` and its descendants, in MB (Linux /proc; 0 where unreadable)."""
    page_bytes, total = os.sysconf("SC_PAGE_SIZE"), 0
    for current in process_tree(pid):
        try:
            total += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * page_bytes
        except (OSError, ValueError, IndexError):
            continue
    return total >> 20


def _kill_session(process: subprocess.Popen) -> None:
    """Kill the worker and anything it spawned, then reap it."""
    with _live_lock:
        _live.discard(process)
        uid = _uids.pop(process.pid, None)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    if uid is not None:  # its namespace's processes ended with it
        sandbox.release_uid(uid)
    for stream in (process.stdin, process.stdout):
        with contextlib.suppress(OSError, ValueError):
            if stream is not None:
                stream.close()
