"""A conversation with one session worker: start it (or take a pooled one), send steps, read replies.

The worker is started by tasks/isolate.py, with its limits and isolation; this module holds the
device slot for the whole session, writes steps to the worker's stdin and reads its replies from the
reply pipe with a deadline, watching its resident memory as run_worker does. A worker that dies,
hangs or runs out of memory ends the conversation with `WorkerEnded`, carrying the outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks import slots
from tasks.harness.protocol import WorkerRequest, encode, failure
from tasks.isolate import (
    RESIDENT_CHECK_S,
    Limits,
    _kill_session,
    _log_tail,
    _outcome_from_exit,
    _resident_mb,
    _start_worker,
    _Worker,
    _worker_env,
)

if TYPE_CHECKING:
    from tasks.pool import WorkerPool

MAX_REPLY_BYTES = 1 << 20


class WorkerEnded(Exception):
    """The session is over before its end: `outcome` says how (timeout, runtime_error, ...)."""

    def __init__(self, outcome: dict[str, Any]):
        super().__init__(outcome.get("error_excerpt", ""))
        self.outcome = outcome


@dataclass
class Conversation:
    worker: _Worker
    limits: Limits
    deadline: float
    started: float
    _pending: bytes = b""

    @property
    def control_path(self) -> Path:
        return self.worker.control_path

    @property
    def pid(self) -> int:
        return self.worker.process.pid

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.worker.process.stdin.write(encode(message))
            self.worker.process.stdin.flush()
        except OSError:
            raise WorkerEnded(self._ended()) from None

    def receive(self) -> dict[str, Any]:
        """The worker's next reply line, parsed; WorkerEnded if it dies, hangs past the session's
        deadline or holds more than its resident-memory limit first."""
        stream = self.worker.process.stdout
        next_check = 0.0
        while b"\n" not in self._pending:
            now = time.perf_counter()
            if now >= self.deadline:
                raise WorkerEnded(self._timed_out())
            if self.limits.resident_mb is not None and now >= next_check:
                next_check = now + RESIDENT_CHECK_S
                if (in_use := _resident_mb(self.pid)) > self.limits.resident_mb:
                    _kill_session(self.worker.process)
                    log = _log_tail(self.control_path / "worker.log")
                    excerpt = f"killed at {in_use} MB resident, over the limit of {self.limits.resident_mb} MB\n{log}"
                    raise WorkerEnded(failure("runtime_error", "out_of_memory", excerpt))
            wait_s = min(self.deadline - now, RESIDENT_CHECK_S if self.limits.resident_mb else 1.0)
            ready, _, _ = select.select([stream], [], [], max(0.0, wait_s))
            if not ready:
                continue
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                raise WorkerEnded(self._ended())
            self._pending += chunk
            if len(self._pending) > MAX_REPLY_BYTES:
                raise WorkerEnded(failure("integrity_violation", "malformed_reply", "reply too long"))
        line, self._pending = self._pending.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            excerpt = f"the worker's reply is not a JSON object: {line[:200]!r}"
            raise WorkerEnded(failure("integrity_violation", "malformed_reply", excerpt))
        return reply

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.receive()

    def _timed_out(self) -> dict[str, Any]:
        _kill_session(self.worker.process)
        log = _log_tail(self.control_path / "worker.log")
        return failure("timeout", "wall_time_limit", f"no result after {self.limits.wall_s:g} s\n{log}")

    def _ended(self) -> dict[str, Any]:
        try:
            returncode = self.worker.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_session(self.worker.process)
            returncode = self.worker.process.returncode
        log = _log_tail(self.control_path / "worker.log")
        return _outcome_from_exit(returncode if returncode is not None else 0, log, self.limits)


@contextlib.contextmanager
def conversation(
    request: WorkerRequest,
    limits: Limits,
    kernel_cache: Path,
    threads: int | None,
    pool: WorkerPool | None,
    slot_mode: str,
) -> Iterator[Conversation]:
    """A session worker for `request`, inside the device slot of a `slot_mode` stage (verify, time or
    baseline), killed when the block ends."""
    kernel_cache.mkdir(parents=True, exist_ok=True)
    env = _worker_env(kernel_cache, threads, request.visible_devices)
    warm_device = "cuda" if request.backend in ("cuda", "triton") else "cpu"
    timing = slot_mode in ("time", "baseline", "paired")
    nonce = secrets.token_hex(16)
    request_json = replace(request, threads=threads, nonce=nonce, limits=_limits_for_worker(limits)).to_json()
    with slots.device_slot(request.backend, slot_mode, request.gpu_index):
        start = time.perf_counter()
        if pool is not None:
            worker = pool.take(env, warm_device, refill_now=not timing)
            (worker.control_path / "request.json").write_text(request_json)
            try:
                worker.process.stdin.write(b"go\n")
                worker.process.stdin.flush()
            except OSError:
                pass  # it died while waiting: the first receive says how
        else:
            argv = ["{control}/request.json", "{control}/result.json"]
            worker = _start_worker(argv, env, subprocess.PIPE, request_json)
        talk = Conversation(worker, limits, start + limits.wall_s, start)
        try:
            yield talk
        finally:
            _kill_session(worker.process)
            worker.log_file.close()
            worker.control.cleanup()
            worker.work.cleanup()
    if pool is not None and timing:
        pool.refill(env, warm_device)


def _limits_for_worker(limits: Limits) -> dict[str, Any]:
    return {"cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb, "file_mb": limits.file_mb}
