"""The isolated evaluation worker: one process per candidate and stage.

    python -m tasks.harness.worker REQUEST.json RESULT.json

The request names a mode (compile | verify | time | baseline), the problem and candidate sources,
the backend, size preset and seeds. The result is one JSON object with an `outcome` from
DESIGN.md's list plus the mode's measurements. This module imports torch and the harness only:
nothing of Prefect, LLM clients or Parquet. The parent treats a missing or malformed result as
a failure whatever the exit code.
"""

from __future__ import annotations

import contextlib
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

from tasks.harness import guard, ipc, modules, tensorfile
from tasks.harness.checks import as_tensor_list
from tasks.harness.cpu import CompileError
from tasks.harness.dispatch import library_calls, record_ops
from tasks.harness.timing import TimingConfig, hidden_work_ms, remembered_ms, time_callable

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


def _load_candidate(request: dict[str, Any], workdir: Path):
    candidate = _run_candidate_code(
        "import", modules.load_module, request["candidate_source"], "candidate", workdir, None
    )
    if not isinstance(getattr(candidate, "ModelNew", None), type):
        raise Outcome("compile_error", "no_ModelNew", "the candidate defines no class ModelNew")
    return candidate


def _setup_reference(request: dict[str, Any], workdir: Path):
    """Device, problem module and reference Model; no candidate code in this process."""
    device = modules.device_for(request["backend"])
    problem = modules.load_module(request["problem_source"], "problem", workdir, request.get("size_preset"))
    return device, problem, modules.build_model(problem, problem.Model, request["init_seed"], device)


def _setup_candidate(request: dict[str, Any], workdir: Path, compile_only: bool = False):
    """Device, problem module and the candidate's ModelNew (the reference Model is never run here:
    its outputs come from a separate reference worker, so none are left in this process's memory,
    INTEGRITY.md row 5). Harness bindings are checked after the candidate's import and __init__."""
    device = modules.device_for(request["backend"], compile_only)
    problem = modules.load_module(request["problem_source"], "problem", workdir, request.get("size_preset"))
    bindings = guard.snapshot()
    candidate = _load_candidate(request, workdir)
    model_new = _run_candidate_code(
        "init", modules.build_model, problem, candidate.ModelNew, request["init_seed"], device
    )
    _check_harness(bindings, "import")
    return device, problem, model_new, bindings


def _check_harness(bindings: dict, stage: str) -> None:
    if changed := guard.patched(bindings):
        excerpt = f"the candidate replaced {', '.join(changed[:8])} during {stage}"
        raise Outcome("integrity_violation", "harness_patched", excerpt)


def _check_output_tensors(output: Any, device: torch.device) -> None:
    """Exact torch.Tensor on `device`, checked before anything touches the output: `.detach().cpu()`
    on a subclass runs the candidate's code and can hand back a plain tensor (INTEGRITY.md row 4)."""
    for index, tensor in enumerate(output if isinstance(output, (tuple, list)) else [output]):
        if isinstance(tensor, torch.Tensor) and type(tensor) is not torch.Tensor:
            report = f"output {index} is {type(tensor).__name__}, not torch.Tensor"
            raise Outcome("integrity_violation", "not_a_tensor", report)
        if isinstance(tensor, torch.Tensor) and tensor.device.type != device.type:
            raise Outcome("shape_mismatch", "device", f"output {index} is on {tensor.device}, expected {device}")


def _save_output(output: Any, name: str, request: dict[str, Any], handover: dict[str, Any]) -> None:
    """Hand the candidate's output (tensors only) to the parent, which compares it: as IPC handles of
    device copies when the request says "device", else as files in its outputs_dir. Refuse anything
    that is not a tensor or a tuple/list of tensors, or far larger than the reference's (twice as
    large is a dtype mismatch the parent names; much more would only fill the disk or the device)."""
    tensors = output if isinstance(output, (tuple, list)) else [output]
    for index, tensor in enumerate(tensors):
        if type(tensor) is not torch.Tensor:
            report = f"output {index} is {type(tensor).__name__}, not torch.Tensor"
            raise Outcome("integrity_violation", "not_a_tensor", report)
    size = sum(t.numel() * t.element_size() for t in tensors)
    if size > 2 * request["output_bytes"] + (1 << 20):
        excerpt = f"the output holds {size} bytes; the reference's {request['output_bytes']}"
        raise Outcome("shape_mismatch", "output_size", excerpt)
    _hand_over(output, name, request, handover)


def _hand_over(output: Any, name: str, request: dict[str, Any], handover: dict[str, Any]) -> None:
    """`output` to the parent under `name`: into `handover` (IPC headers) or a file in outputs_dir;
    the seconds it took are added to handover["_s"]."""
    start = time.perf_counter()
    on_device = all(isinstance(t, torch.Tensor) and t.is_cuda for t in as_tensor_list(output))
    if request.get("handover") == "device" and on_device:
        handover.setdefault("outputs", {})[name] = ipc.export(output)
    else:
        tensorfile.write(output, Path(request["outputs_dir"]) / f"{name}.json")
    handover["_s"] = handover.get("_s", 0.0) + time.perf_counter() - start


def _handover_result(handover: dict[str, Any]) -> dict[str, Any]:
    return {"handover": handover.get("outputs"), "handover_s": handover.get("_s", 0.0)}


def run_compile(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Import the candidate (its module-level compiles run here) and construct ModelNew."""
    start = time.perf_counter()
    _setup_candidate(request, workdir, compile_only=True)
    return {"outcome": "correct", "compile_s": time.perf_counter() - start}


@contextlib.contextmanager
def poisoned_allocations():
    """Memory from torch.empty & co. reads as NaN (max int for integers) while this is active, so an
    output element the kernel never writes fails the check instead of passing on lucky contents."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    # The C setters: torch.use_deterministic_algorithms also imports torch._inductor's config, 2 s
    # per worker. warn_only: ops without a deterministic implementation still run, with a warning.
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    torch._C._set_deterministic_fill_uninitialized_memory(True)
    try:
        yield
    finally:
        torch._C._set_deterministic_algorithms(enabled, warn_only=warn_only)


def run_reference(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Trusted (no candidate code): the reference's outputs for every verify and timing seed, handed
    to the parent to judge candidates against (see `_expected_outputs`)."""
    try:
        device, problem, reference = _setup_reference(request, workdir)
    except Exception as exc:  # the problem itself is broken: no candidate can be judged against it
        raise Outcome("runtime_error", "reference_failed", _excerpt("".join(traceback.format_exception(exc)))) from None
    return {"outcome": "correct", **_expected_outputs(request, device, problem, reference)}


def _expected_outputs(request: dict[str, Any], device: torch.device, problem, reference) -> dict[str, Any]:
    """The reference's outputs for the verify seeds (verify_N) and the timing seeds (time_N), handed
    over like a candidate's (`_hand_over`: IPC handles or files in outputs_dir); returned with what
    the candidate's own checks need (the ops the reference dispatches, whether it returns an input,
    the output size) and `expected_s`, the seconds all this took."""
    start = time.perf_counter()
    handover: dict[str, Any] = {}
    try:
        with torch.no_grad():
            outputs = {}
            for trial, seed in enumerate(request["seeds"]):
                inputs = modules.make_inputs(problem, seed, device)
                if trial == 0:
                    outputs["verify_0"], reference_ops = record_ops(reference, *inputs)
                    reference_aliases = _aliases_an_input(outputs["verify_0"], inputs)
                else:
                    outputs[f"verify_{trial}"] = reference(*inputs)
            for index, seed in enumerate(request["time_seeds"]):
                outputs[f"time_{index}"] = reference(*modules.make_inputs(problem, seed, device))
            modules.synchronize(device)
    except Exception as exc:  # the problem itself is broken: no candidate can be judged against it
        raise Outcome("runtime_error", "reference_failed", _excerpt("".join(traceback.format_exception(exc)))) from None
    for name, output in outputs.items():
        _hand_over(output, name, request, handover)
    sizes = [sum(t.numel() * t.element_size() for t in as_tensor_list(o)) for o in outputs.values()]
    return {
        "reference_ops": sorted(reference_ops),
        "reference_aliases": reference_aliases,
        "output_bytes": max(sizes),
        "trials": len(request["seeds"]),
        "handover": handover.get("outputs"),
        "expected_s": time.perf_counter() - start,
    }


def run_verify(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """The candidate on several trials, each with fresh inputs from a seed it never saw; each output
    goes to a file the parent compares with the reference's. Checked here, where only the process
    that ran it can see: the ops it dispatched, its inputs left unchanged, no input handed back."""
    device, problem, model_new, bindings = _setup_candidate(request, workdir)
    handover: dict[str, Any] = {}
    with torch.no_grad():
        trial_inputs = [modules.make_inputs(problem, seed, device) for seed in request["seeds"]]
        modules.synchronize(device)
        for trial, inputs in enumerate(trial_inputs):
            inputs_before = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
            with poisoned_allocations():
                if trial == 0:
                    output, candidate_ops = _run_candidate_code("forward", record_ops, model_new, *inputs)
                    _check_library_calls(request, set(request["reference_ops"]), candidate_ops)
                else:
                    output = _run_candidate_code("forward", model_new, *inputs)
                modules.synchronize(device)
            _check_harness(bindings, "forward")
            _check_inputs_unchanged(inputs_before, inputs)
            _check_output_tensors(output, device)
            if _aliases_an_input(output, inputs) and not request["reference_aliases"]:
                excerpt = "ModelNew.forward returned (a view of) one of its inputs; the reference returns new memory"
                raise Outcome("integrity_violation", "returns_input", excerpt)
            _save_output(output, f"verify_{trial}", request, handover)
    return {"outcome": "correct", "trials": len(trial_inputs), **_handover_result(handover)}


def _aliases_an_input(output: Any, inputs: list[Any]) -> bool:
    """Whether any output tensor shares memory with any input tensor (INTEGRITY.md row 6)."""
    input_storages = {v.untyped_storage().data_ptr() for v in inputs if isinstance(v, torch.Tensor)}
    outputs = output if isinstance(output, (tuple, list)) else [output]
    return any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in input_storages for o in outputs)


def _check_library_calls(request: dict[str, Any], reference_ops: set[str], candidate_ops: set[str]) -> None:
    """INTEGRITY.md row 1: the candidate may not call the torch operators the reference computes."""
    calls = library_calls(reference_ops, candidate_ops)
    if calls and not request.get("allow_library_calls", False):
        names = ", ".join(f"aten::{name}" for name in calls)
        excerpt = f"ModelNew.forward dispatched {names}, which the reference computes (library calls are off)"
        raise Outcome("integrity_violation", "reference_op", excerpt)


def _check_inputs_unchanged(before: list[Any], after: list[Any]) -> None:
    for index, (old, new) in enumerate(zip(before, after)):
        if isinstance(old, torch.Tensor) and not torch.equal(old, new):
            raise Outcome("integrity_violation", "modified_input", f"the candidate wrote into input {index}")


def _timing_inputs(request: dict[str, Any], problem, device) -> list[list[Any]]:
    return [modules.make_inputs(problem, seed, device) for seed in request["time_seeds"]]


def run_time(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Time the candidate; its last timed output goes to a file the parent checks against the
    reference's output for the same inputs (INTEGRITY.md row 3)."""
    device, problem, model_new, bindings = _setup_candidate(request, workdir)
    input_sets = _timing_inputs(request, problem, device)
    spare = modules.make_inputs(problem, request["spare_seed"], device) if "spare_seed" in request else None
    config = TimingConfig(**request.get("timing", {}))
    timing = _run_candidate_code("timing", time_callable, model_new, input_sets, device, config, spare)
    _check_harness(bindings, "timing")
    if (first_sight_ms := remembered_ms(timing)) is not None:
        excerpt = (
            f"runs on inputs no earlier call had seen took {first_sight_ms:.3f} ms and more, runs on inputs "
            f"seen before {timing.seen_median_ms:.3f} ms (median): outputs remembered by their inputs"
        )
        raise Outcome("integrity_violation", "remembered_output", excerpt)
    if (hidden_ms := hidden_work_ms(timing)) is not None:
        excerpt = (
            f"the device stayed busy {hidden_ms:.3f} ms after the timed stream finished (measured "
            f"{timing.median_ms:.3f} ms): work on a side stream escapes the timing window"
        )
        raise Outcome("integrity_violation", "side_stream", excerpt)
    _check_output_tensors(timing.last_output, device)
    handover: dict[str, Any] = {}
    _save_output(timing.last_output, "last_timed", request, handover)
    return {
        "outcome": "correct",
        "runtime_ms": timing.median_ms,
        "runtime_p10_ms": timing.p10_ms,
        "runtime_p90_ms": timing.p90_ms,
        "timed_runs": timing.runs,
        "sync_gap_ms": timing.sync_gap_ms,
        "last_input_index": timing.last_input_index,
        **_handover_result(handover),
    }


def run_baseline(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Time the reference eagerly and under torch.compile with the same protocol; when the request
    says `expected`, then also hand over the reference's outputs as the reference mode does (the
    parent's judge needs them once per problem, and this process has already paid for its start)."""
    try:
        device, problem, reference = _setup_reference(request, workdir)
        input_sets = _timing_inputs(request, problem, device)
        config = TimingConfig(**request.get("timing", {}))
        eager = time_callable(reference, input_sets, device, config)
    except Exception as exc:  # the problem itself is broken: no candidate can be judged against it
        raise Outcome("runtime_error", "reference_failed", _excerpt("".join(traceback.format_exception(exc)))) from None
    result: dict[str, Any] = {
        "outcome": "correct",
        "eager_ms": eager.median_ms,
        "eager_p10_ms": eager.p10_ms,
        "eager_p90_ms": eager.p90_ms,
        "compile_ms": None,
        "torch_compile_error": None,
    }
    if request.get("torch_compile", True):
        try:
            compiled = torch.compile(reference)
            compiled_timing = time_callable(compiled, input_sets, device, config)
            result["compile_ms"] = compiled_timing.median_ms
        except Exception as exc:  # a baseline torch cannot compile is recorded, not fatal
            result["torch_compile_error"] = _excerpt(f"{type(exc).__name__}: {exc}")
    if request.get("expected"):
        result.update(_expected_outputs(request, device, problem, reference))
    return result


CANDIDATE_MODES = ("compile", "verify", "time")
MODES = {
    "compile": run_compile,
    "reference": run_reference,
    "verify": run_verify,
    "time": run_time,
    "baseline": run_baseline,
}


def evaluate(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run one mode and return its result; candidate failures become outcomes, never exceptions."""
    threads = request.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    try:
        return MODES[request["mode"]](request, workdir)
    except Outcome as outcome:
        return {
            "outcome": outcome.outcome,
            "error_class": outcome.error_class,
            "error_excerpt": outcome.excerpt,
        }


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


def isolate_network() -> bool:
    """Linux: move this process into a new, empty network namespace (no interfaces, so no network,
    not even loopback to the orchestrator's host). Needs root or unprivileged user namespaces;
    where neither is allowed, say so in the worker log and go on."""
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet, clone_newuser = 0x40000000, 0x10000000
    for flags in (clone_newnet, clone_newuser | clone_newnet):
        if libc.unshare(flags) == 0:
            return True
    print(f"kforge: warning: no network isolation for this worker ({os.strerror(ctypes.get_errno())})", flush=True)
    return False


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
    if not sys.stdin.readline():
        return None
    return control_dir / "request.json", control_dir / "result.json"


def main(argv: list[str]) -> int:
    die_with_parent()
    if argv[1] == "--standby":
        paths = wait_for_request(Path(argv[2]), argv[3])
        if paths is None:
            os._exit(0)
        request_path, result_path = paths
    else:
        request_path, result_path = Path(argv[1]), Path(argv[2])
    request = json.loads(request_path.read_text())
    # The nonce proves the result was written by this harness code: the request file is gone before
    # any candidate code runs, and the nonce lives on only in this frame, which candidates cannot
    # reach (the pre-check refuses frame and gc introspection).
    request_path.unlink(missing_ok=True)
    nonce = request.pop("nonce", None)
    apply_limits(request.get("limits", {}))
    # The reference alone (reference, baseline) keeps the network: torch.compile's workers may need
    # loopback. A standby GPU worker made its CUDA context first; the namespace does not disturb it.
    network_isolated = isolate_network() if request["mode"] in CANDIDATE_MODES else False
    result = {**evaluate(request, Path.cwd()), "network_isolated": network_isolated, "nonce": nonce}
    partial = result_path.with_suffix(".partial")
    partial.write_text(json.dumps(result))
    os.replace(partial, result_path)
    sys.stdout.flush()
    if request.get("hold"):
        # Handed-over device memory lives as long as this process: the parent kills it once it has
        # copied the outputs (tasks/harness/ipc.py), or at the wall-time limit.
        while True:
            time.sleep(3600)
    # Skip interpreter teardown: candidate extensions and OpenMP pools can crash at exit,
    # which would only obscure a result already written.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
