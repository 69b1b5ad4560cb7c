"""The isolated evaluation worker: one process per candidate and stage.

    python -m tasks.harness.worker REQUEST.json RESULT.json      (or --standby CONTROL_DIR DEVICE)

The request (tasks/harness/protocol.py) names a mode. `compile` imports the candidate, whose
module-level code builds its kernels, constructs ModelNew and writes one result file. `session`
builds the model (the candidate's ModelNew, or the trusted reference) and then answers the
orchestrator's steps on stdin, one reply line each on the reply pipe (tasks/harness/session.py):
the orchestrator makes the inputs, clocks the calls and judges the outputs. `profile` builds the
model as a session does, then profiles one call of it and writes one result file
(tasks/harness/profiling.py; advisory, never a verdict or a time). This module imports
torch and the harness only: nothing of Prefect, LLM clients or Parquet. The parent treats a missing
or malformed result as a failure whatever the exit code.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from tasks.harness import extensions, guard, modules, profiling, sandbox, session
from tasks.harness.cpu import CompileError
from tasks.harness.protocol import WorkerRequest

EXCERPT_CHARS = 4000


class Outcome(Exception):
    """Ends the evaluation early with a recorded outcome."""

    def __init__(self, outcome: str, error_class: str, excerpt: str):
        super().__init__(excerpt)
        self.outcome, self.error_class, self.excerpt = outcome, error_class, excerpt


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else "...\n" + text[-EXCERPT_CHARS:]


def classify_exception(exc: BaseException, stage: str) -> Outcome:
    """Map an exception raised by candidate code during `stage` to an outcome."""
    text = _excerpt("".join(traceback.format_exception(exc)))
    message = str(exc)
    if isinstance(exc, CompileError):
        return Outcome("compile_error", "CompileError", _excerpt(message))
    if isinstance(exc, SyntaxError) and stage == "import":
        return Outcome("compile_error", "SyntaxError", text)
    if isinstance(exc, RuntimeError) and "Error building extension" in message:
        return Outcome("compile_error", "load_inline", _excerpt(message))
    if isinstance(exc, MemoryError) or "can't allocate memory" in message or "out of memory" in message:
        return Outcome("runtime_error", "out_of_memory", text)
    return Outcome("runtime_error", f"{type(exc).__name__} in {stage}", text)


def _run_candidate_code(stage: str, fn, *args):
    try:
        return fn(*args)
    except Outcome:
        raise
    except BaseException as exc:  # candidate code may raise anything, SystemExit included
        raise classify_exception(exc, stage) from None


def _load_candidate(request: WorkerRequest, workdir: Path):
    candidate = _run_candidate_code("import", modules.load_module, request.candidate_source, "candidate", workdir, None)
    if not isinstance(getattr(candidate, "ModelNew", None), type):
        raise Outcome("compile_error", "no_ModelNew", "the candidate defines no class ModelNew")
    return candidate


def _setup_candidate(request: WorkerRequest, workdir: Path, compile_only: bool = False):
    """Device, problem module and the candidate's ModelNew; harness bindings are checked after the
    candidate's import and __init__."""
    device = modules.device_for(request.backend, compile_only)
    problem = modules.load_module(request.problem_source, "problem", workdir, request.size_preset)
    bindings = guard.snapshot()
    candidate = _load_candidate(request, workdir)
    model_new = _run_candidate_code("init", modules.build_model, problem, candidate.ModelNew, request.init_seed, device)
    _check_harness(bindings, "import")
    return device, problem, model_new, bindings


def _check_harness(bindings: dict, stage: str) -> None:
    if changed := guard.patched(bindings):
        excerpt = f"the candidate replaced {', '.join(changed[:8])} during {stage}"
        raise Outcome("integrity_violation", "harness_patched", excerpt)


def run_compile(request: WorkerRequest, workdir: Path) -> dict[str, Any]:
    """Import the candidate (its module-level compiles run here) and construct ModelNew."""
    start = time.perf_counter()
    _setup_candidate(request, workdir, compile_only=True)
    return {"outcome": "correct", "compile_s": time.perf_counter() - start}


def run_profile(request: WorkerRequest, workdir: Path) -> dict[str, Any]:
    """Build the candidate's ModelNew or the reference Model as a session does, then profile one call."""
    try:
        device, model, _ = session._setup(request, workdir, _session_failure)
    except session.Failure as failed:
        raise Outcome(failed.outcome, failed.error_class, failed.excerpt) from None
    problem = modules.load_module(request.problem_source, "profiled_problem", workdir, request.size_preset)
    return _run_candidate_code("forward", profiling.profile_model, model, problem, device, request)


def evaluate(request: WorkerRequest, workdir: Path) -> dict[str, Any]:
    """The compile or profile mode's result; candidate failures become outcomes, never exceptions."""
    if request.threads:
        torch.set_num_threads(int(request.threads))
    try:
        return run_profile(request, workdir) if request.mode == "profile" else run_compile(request, workdir)
    except Outcome as outcome:
        return {"outcome": outcome.outcome, "error_class": outcome.error_class, "error_excerpt": outcome.excerpt}


def _session_failure(exc: BaseException, stage: str) -> session.Failure:
    outcome = classify_exception(exc, stage)
    return session.Failure(outcome.outcome, outcome.error_class, outcome.excerpt)


def apply_limits(limits: dict[str, Any]) -> None:
    """CPU-time and address-space limits for this process, set before any candidate code runs."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu_s = int(limits.get("cpu_s") or 0)
    if cpu_s:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    memory_mb = limits.get("memory_mb")
    if memory_mb:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    file_mb = limits.get("file_mb")
    if file_mb:  # no single file past this: a candidate cannot fill the disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))


def die_with_parent() -> None:
    """Linux: have the kernel kill this worker if the orchestrator dies, so no candidate outlives a run."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_for_request(control_dir: Path, warm_device: str) -> tuple[Path, Path] | None:
    """Standby: make the CUDA context now, while nobody waits, then block until the orchestrator
    writes a request into `control_dir` and says go (a line on stdin). None: closed unused."""
    if warm_device == "cuda" and torch.cuda.is_available():
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        # A process's first device trace loads and sets up CUPTI (76 ms on an H200 against 14 ms for
        # later ones, the second 36 ms): a spare pays that here, not its first watched calls. They
        # also measure the device's clock for the gate kernel, sized for a first call afterwards.
        from tasks.harness.dispatch import GATE_FIRST_MS, record_ops, set_gate_ms

        for _ in range(2):
            record_ops(lambda: None, device_kernels=True)
        set_gate_ms(GATE_FIRST_MS)
    if not sys.stdin.readline():
        return None
    return control_dir / "request.json", control_dir / "result.json"


def main(argv: list[str]) -> int:
    # First of all, before any CUDA context and any candidate code: the OS-level sandbox (namespaces,
    # private /tmp and /dev/shm, read-only project, a user of its own; tasks/harness/sandbox.py).
    isolation = sandbox.enter(**sandbox.from_environment())
    # Replies go to the pipe the parent reads (this process's stdout as started); anything the
    # candidate prints goes to the log with stderr.
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    die_with_parent()  # after enter(): a change of user id clears the parent-death signal
    if argv[1] == "--standby":
        paths = wait_for_request(Path(argv[2]), argv[3])
        if paths is None:
            os._exit(0)
        request_path, result_path = paths
    else:
        request_path, result_path = Path(argv[1]), Path(argv[2])
    request = WorkerRequest.from_json(request_path.read_text())
    # The nonce proves the result was written by this harness code: the request file is gone before
    # any candidate code runs. (A session's replies are claims the orchestrator checks: no nonce.)
    request_path.unlink(missing_ok=True)
    nonce = request.nonce
    apply_limits(request.limits)
    if "cpp_extension" in (request.candidate_source or ""):
        extensions.install()  # a build directory of each build's own (tasks/harness/extensions.py)
    network_isolated = isolation["network"].startswith("ok")
    if request.mode == "session":
        if request.threads:
            torch.set_num_threads(int(request.threads))
        session.serve(request, Path.cwd(), sys.stdin.buffer, reply_fd, _session_failure, isolation)
        os._exit(0)
    result = {
        **evaluate(request, Path.cwd()),
        "network_isolated": network_isolated,
        "isolation": isolation,
        "nonce": nonce,
    }
    partial = result_path.with_suffix(".partial")
    partial.write_text(json.dumps(result))
    os.replace(partial, result_path)
    sys.stdout.flush()
    # Skip interpreter teardown: candidate extensions and OpenMP pools can crash at exit,
    # which would only obscure a result already written.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
