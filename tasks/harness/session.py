"""The worker's side of a session: build the model once, then run one call per `call` line.

The orchestrator (tasks/drive.py) writes each call's inputs into this process's input buffers just
before the `call` line and clocks the call from its own process, so nothing here decides a time or a
verdict: the claimed time this side reports is used only where the orchestrator's own observation
bears it out, and the outputs copied into the output buffers are judged there. The checks done here
(output structure, aliasing, dispatched ops, patched harness) are a first line a candidate can
bypass; they name what an honest mistake did wrong.

Verify and timing sessions are the same request and the same steps: the only difference is how many
calls the orchestrator makes, which of them it judges and which it records ops for, and it decides
that on its own.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

import torch

from tasks.harness import guard, modules
from tasks.harness.buffers import DTYPES, file_view, typed
from tasks.harness.checks import as_tensor_list
from tasks.harness.dispatch import record_ops
from tasks.harness.protocol import Layout, WorkerRequest, encode, failure

_clock = time.perf_counter
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_device_synchronize = torch.cuda.synchronize


class Failure(Exception):
    """A claimed outcome of this worker (compile_error, runtime_error, shape_mismatch, ...)."""

    def __init__(self, outcome: str, error_class: str, excerpt: str):
        super().__init__(excerpt)
        self.outcome, self.error_class, self.excerpt = outcome, error_class, excerpt

    def message(self) -> dict[str, Any]:
        return failure(self.outcome, self.error_class, self.excerpt)


def serve(
    request: WorkerRequest, workdir: Path, commands: BinaryIO, reply_fd: int, classify, isolation: dict | None = None
) -> None:
    """Answer the orchestrator's steps until `end` or end of input. `classify(exc, stage)` maps an
    exception of candidate code to a Failure; `isolation` (the sandbox's layers, found before any
    candidate code ran) goes with the first reply."""

    def reply(message: dict[str, Any]) -> None:
        os.write(reply_fd, encode(message))

    start = _clock()
    isolation = dict(isolation or {})
    try:
        device, model, bindings = _setup(request, workdir, classify)
    except Failure as failure:
        reply(failure.message())
        return
    reply({"ready": True, "setup_s": _clock() - start, "isolation": isolation})
    state: dict[str, Any] = {}
    for line in commands:
        step = _parse(line)
        try:
            if step.get("step") == "layout":
                reply(_allocate(step, device, state))
            elif step.get("step") == "call":
                reply(_call(step, model, device, state, bindings, classify))
            elif step.get("step") == "echo":
                reply(_call({"step": "call"}, state["echo_model"], device, state, bindings, classify))
            elif step.get("step") == "check":
                _check_harness(bindings, "the calls")
                reply({"ok": True})
            elif step.get("step") == "compile":
                model = _compiled(model)
                reply({"ok": True})
            else:
                return
        except Failure as failure:
            reply(failure.message())
            return


def _parse(line: bytes) -> dict[str, Any]:
    import json

    try:
        step = json.loads(line)
    except ValueError:
        return {}
    return step if isinstance(step, dict) else {}


def _setup(request: WorkerRequest, workdir: Path, classify):
    device = modules.device_for(request.backend)
    problem = modules.load_module(request.problem_source, "problem", workdir, request.size_preset)
    bindings = guard.snapshot()
    if request.model == "reference":
        try:
            return device, modules.build_model(problem, problem.Model, request.init_seed, device), bindings
        except Exception as exc:  # the problem itself is broken
            excerpt = "".join(traceback.format_exception(exc))[-4000:]
            raise Failure("runtime_error", "reference_failed", excerpt) from None
    try:
        candidate = modules.load_module(request.candidate_source or "", "candidate", workdir, None)
    except BaseException as exc:  # candidate code may raise anything, SystemExit included
        raise classify(exc, "import") from None
    if not isinstance(getattr(candidate, "ModelNew", None), type):
        raise Failure("compile_error", "no_ModelNew", "the candidate defines no class ModelNew")
    try:
        model = modules.build_model(problem, candidate.ModelNew, request.init_seed, device)
    except BaseException as exc:
        raise classify(exc, "init") from None
    _check_harness(bindings, "import")
    return device, model, bindings


def _compiled(model):
    try:
        return torch.compile(model)
    except Exception as exc:  # a baseline torch cannot compile is recorded, not fatal
        raise Failure("runtime_error", "torch_compile", f"{type(exc).__name__}: {exc}"[-4000:]) from None


def _allocate(step: dict[str, Any], device: torch.device, state: dict[str, Any]) -> dict[str, Any]:
    """Input and output buffers for `step`'s layout: views into the shared file on the cpu, device
    allocations exported as IPC handles on a GPU."""
    layout = Layout.from_message(step)
    state["layout"], state["aliases_allowed"] = layout, bool(step.get("reference_aliases"))
    if device.type == "cuda":
        from tasks.harness import ipc

        inputs, input_handles = [], []
        for spec in layout.inputs:
            view, handle = ipc.exportable(spec.nbytes, device) if spec else (None, None)
            inputs.append(None if spec is None else typed(view, spec))
            input_handles.append(handle)
        outputs, output_handles = [], []
        for spec in layout.outputs:
            view, handle = ipc.exportable(spec.nbytes, device)
            outputs.append(typed(view, spec))
            output_handles.append(handle)
        state["inputs"], state["outputs"] = inputs, outputs
        reply = {"ok": True, "inputs": input_handles, "outputs": output_handles}
    else:
        input_offsets, output_offsets, total = layout.offsets()
        with open(layout.buffer_path, "r+b") as handle:
            shared = mmap.mmap(handle.fileno(), total)
        state["mmap"] = shared
        state["inputs"] = [
            None if spec is None else file_view(shared, offset, spec)
            for spec, offset in zip(layout.inputs, input_offsets)
        ]
        state["outputs"] = [file_view(shared, offset, spec) for spec, offset in zip(layout.outputs, output_offsets)]
        reply = {"ok": True}
    # An empty call runs every step of a call but the model: it hands back ready outputs
    echo = [torch.zeros(s.shape, dtype=DTYPES[s.dtype], device=device) for s in layout.outputs]
    ready = echo[0] if layout.output_container is None else tuple(echo) if layout.output_container == "tuple" else echo
    state["echo_model"] = lambda *args: ready
    return reply


@contextlib.contextmanager
def _poisoned_allocations():
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


def _call(step, model, device, state, bindings, classify) -> dict[str, Any]:
    """One call. A `watched` call (every verify call, a random few timed calls, never counted in a
    time) records the ops it dispatches and poisons fresh allocations."""
    layout: Layout = state["layout"]
    scalars = step.get("scalars") or {}
    args = [scalars.get(str(i)) if tensor is None else tensor for i, tensor in enumerate(state["inputs"])]
    record = bool(step.get("record"))
    ops: set[str] = set()
    overrun_ms = None
    with torch.no_grad(), _poisoned_allocations() if record else contextlib.nullcontext():
        try:
            if device.type == "cuda":
                # No spin ahead of the start event: work a candidate puts on another stream would run
                # beside the spin, inside the echo's share of the round trip (measured on an H200).
                start, end = _Event(enable_timing=True), _Event(enable_timing=True)
                _record(start)
                output, ops, overrun_ms = (
                    record_ops(model, *args, device_kernels=True) if record else (model(*args), ops, None)
                )
                _record(end)
                _device_synchronize()  # side streams included: the copy below must see finished outputs
                claimed_ms = _elapsed_time(start, end)
            else:
                began = _clock()
                output, ops, _ = record_ops(model, *args) if record else (model(*args), ops, None)
                claimed_ms = (_clock() - began) * 1000
        except Failure:
            raise
        except BaseException as exc:
            raise classify(exc, "forward") from None
        _check_output(output, layout, device)
        if not state["aliases_allowed"] and _aliases(output, args):
            excerpt = "ModelNew.forward returned (a view of) one of its inputs; the reference returns new memory"
            raise Failure("integrity_violation", "returns_input", excerpt)
        for target, tensor in zip(state["outputs"], as_tensor_list(output)):
            target.copy_(tensor)
        modules.synchronize(device)
    return {"claimed_ms": claimed_ms, "ops": sorted(ops) if record else None, "device_overrun_ms": overrun_ms}


def _check_output(output: Any, layout: Layout, device: torch.device) -> None:
    """Exactly torch.Tensor (a subclass can defer or fake its work, INTEGRITY.md row 4), on the
    device, in the reference's structure, shapes and dtypes."""
    tensors = as_tensor_list(output)
    container = type(output).__name__ if isinstance(output, (tuple, list)) else None
    if container != layout.output_container:
        report = f"expected {layout.output_container or 'Tensor'} output, got {type(output).__name__}"
        raise Failure("shape_mismatch", "output_structure", report)
    if len(tensors) != len(layout.outputs):
        raise Failure("shape_mismatch", "output_count", f"expected {len(layout.outputs)} outputs, got {len(tensors)}")
    for index, (tensor, spec) in enumerate(zip(tensors, layout.outputs)):
        if type(tensor) is not torch.Tensor:
            report = f"output {index} is {type(tensor).__name__}, not torch.Tensor"
            raise Failure("integrity_violation", "not_a_tensor", report)
        if tensor.device.type != device.type:
            raise Failure("shape_mismatch", "device", f"output {index} is on {tensor.device}, expected {device}")
        if tuple(tensor.shape) != spec.shape:
            report = f"output {index}: expected shape {spec.shape}, got {tuple(tensor.shape)}"
            raise Failure("shape_mismatch", "shape", report)
        if str(tensor.dtype) != spec.dtype:
            raise Failure("shape_mismatch", "dtype", f"output {index}: expected dtype {spec.dtype}, got {tensor.dtype}")


def _aliases(output: Any, inputs: list[Any]) -> bool:
    storages = {v.untyped_storage().data_ptr() for v in inputs if isinstance(v, torch.Tensor) and v.numel()}
    return any(o.untyped_storage().data_ptr() in storages for o in as_tensor_list(output) if o.numel())


def _check_harness(bindings: dict, stage: str) -> None:
    if changed := guard.patched(bindings):
        excerpt = f"the candidate replaced {', '.join(changed[:8])} during {stage}"
        raise Failure("integrity_violation", "harness_patched", excerpt)
