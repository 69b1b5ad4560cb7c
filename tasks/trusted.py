"""The problem as the orchestrator holds it: inputs made from seeds and the reference's outputs.

The orchestrator never runs candidate code, but it runs the problem file (the reference program
the user gave it), so the inputs every call gets and the outputs they are judged against are made
here, from seeds drawn from os.urandom for each call, and never sit where a worker can reach them
(INTEGRITY.md rows 8, 13, 14, 15). One runtime per (problem, backend, sizes, init seed) is kept,
least recently used first out; torch is imported on first use.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import traceback
import types
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tasks.harness.protocol import Layout, TensorSpec

KEPT_RUNTIMES = 8
# torch's global generator is seeded and drawn from by every problem's thread: inputs are made one
# at a time, so a seed gives the same inputs whenever they are made again for judging.
_generator_lock = threading.Lock()
_runtimes_lock = threading.Lock()
_profiler_lock = threading.Lock()
_runtimes: OrderedDict[tuple, ProblemRuntime] = OrderedDict()
# Each problem's parameter and buffer bytes, kept when its runtime is dropped: the workers' memory
# limits make room for them (tasks/drive.py `_limits`)
_parameter_bytes: dict[tuple, int | None] = {}


class ReferenceFailed(Exception):
    """The problem's own Model, get_inputs or get_init_inputs fails: no candidate can be judged."""


@dataclass
class ProblemRuntime:
    module: types.ModuleType
    device: Any  # torch.device
    reference: Any  # the reference Model on `device`
    layout: Layout
    reference_ops: frozenset[str]
    reference_aliases: bool
    scalars: dict[str, Any]  # non-tensor arguments of forward, by position
    input_bytes: int
    output_bytes: int
    flops: int | None
    lock: threading.Lock


def warm_profiler() -> None:
    """Start and stop the torch profiler once on this thread. libkineto wants its first start on
    the thread that imported torch; the first reference recorded from a flow's worker thread
    otherwise printed "ERROR: External init callback must run in same thread as registerClient"."""
    from torch.autograd.profiler import profile

    with _profiler_lock, profile(use_kineto=True):
        pass


_device_traces: dict[int, bool] = {}


def device_traces_work(device: Any) -> bool:
    """Whether the torch profiler's device trace, as the workers take it on watched calls, names the
    gate kernel and marker copy on this GPU, tried once per GPU in this process: where it does, a
    watched call whose trace lacks them had its trace turned off by the candidate."""
    index = device.index or 0
    with _profiler_lock:
        if index not in _device_traces:
            import torch

            from tasks.harness.dispatch import record_ops

            with torch.cuda.device(index):
                _, _, outside_ms = record_ops(lambda: None, device_kernels=True)
            _device_traces[index] = outside_ms is not None
            if outside_ms is None:
                print(f"kforge: warning: no device trace on GPU {index}: side streams are not checked", flush=True)
        return _device_traces[index]


def new_seed() -> int:
    return secrets.randbits(62)


def runtime_for(
    problem_source: str, backend: str, size_preset: str | None, init_seed: int, gpu_index: int = 0
) -> ProblemRuntime:
    """The runtime of this problem on GPU `gpu_index` of a GPU backend (built now if not kept);
    ReferenceFailed if the problem is broken."""
    key = (hashlib.sha256(problem_source.encode()).hexdigest(), backend, size_preset, init_seed, gpu_index)
    with _runtimes_lock:
        runtime = _runtimes.get(key)
        if runtime is not None:
            _runtimes.move_to_end(key)
            return runtime
    runtime = _build(problem_source, backend, size_preset, init_seed, gpu_index)
    from tasks.memory import parameter_bytes

    with _runtimes_lock:
        _runtimes[key] = runtime
        _parameter_bytes[key[:3]] = parameter_bytes(runtime.reference)
        while len(_runtimes) > KEPT_RUNTIMES:
            _runtimes.popitem(last=False)
    return runtime


def known_parameter_bytes(problem_source: str, backend: str, size_preset: str | None) -> int | None:
    """The bytes of the reference's parameters and buffers: as its runtime was built in this process,
    or else as its Model builds them on torch's meta device, which allocates nothing (KernelBench's
    2_ShallowWideMLP: 8.6 GB, known in milliseconds before any worker starts); None where the Model
    cannot be built there (an __init__ that reads its tensors' values)."""
    key = (hashlib.sha256(problem_source.encode()).hexdigest(), backend, size_preset)
    with _runtimes_lock:
        if key in _parameter_bytes:
            return _parameter_bytes[key]
    estimate = _meta_parameter_bytes(problem_source, size_preset)
    with _runtimes_lock:  # a None is kept too: the problem is not loaded again for each stage
        return _parameter_bytes.setdefault(key, estimate)


def _meta_parameter_bytes(problem_source: str, size_preset: str | None) -> int | None:
    import torch

    from tasks.memory import parameter_bytes

    try:
        module = _load(problem_source, size_preset)
        with _generator_lock, torch.device("meta"):  # no problem's inputs are drawn meanwhile
            return parameter_bytes(module.Model(*module.get_init_inputs()))
    except Exception:  # noqa: BLE001 - whatever the problem file raises: its real build reports it
        return None


def _build(
    problem_source: str, backend: str, size_preset: str | None, init_seed: int, gpu_index: int
) -> ProblemRuntime:
    import torch

    from tasks.harness import modules
    from tasks.harness.dispatch import record_ops

    device = torch.device(modules.BACKEND_DEVICES[backend], gpu_index) if backend != "cpu" else torch.device("cpu")
    try:
        module = _load(problem_source, size_preset)
        with _generator_lock:
            reference = modules.build_model(module, module.Model, init_seed, device)
            inputs = _inputs(module, new_seed(), device)
        with torch.no_grad():
            with _profiler_lock:  # one torch profiler per process at a time
                output, ops, _ = record_ops(reference, *inputs, all_threads=False)
        modules.synchronize(device)
        flops = _flops(reference, inputs)
    except Exception as exc:  # noqa: BLE001 - whatever the problem file raises
        from tasks.memory import is_out_of_memory

        if is_out_of_memory(exc):  # the device is full, the problem is not broken (tasks/drive.py says so)
            raise
        raise ReferenceFailed("".join(traceback.format_exception(exc))[-4000:]) from None
    tensors = output if isinstance(output, (tuple, list)) else [output]
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ReferenceFailed(f"the reference returns {type(output).__name__}, not tensors")
    layout = Layout(
        inputs=tuple(_spec(v) if isinstance(v, torch.Tensor) else None for v in inputs),
        outputs=tuple(_spec(t) for t in tensors),
        output_container=type(output).__name__ if isinstance(output, (tuple, list)) else None,
    )
    storages = {v.untyped_storage().data_ptr() for v in inputs if isinstance(v, torch.Tensor) and v.numel()}
    return ProblemRuntime(
        module=module,
        device=device,
        reference=reference,
        layout=layout,
        reference_ops=frozenset(ops),
        reference_aliases=any(t.numel() and t.untyped_storage().data_ptr() in storages for t in tensors),
        scalars={str(i): v for i, v in enumerate(inputs) if not isinstance(v, torch.Tensor)},
        input_bytes=sum(s.nbytes for s in layout.inputs if s is not None),
        output_bytes=sum(s.nbytes for s in layout.outputs),
        flops=flops,
        lock=threading.Lock(),
    )


def _load(problem_source: str, size_preset: str | None) -> types.ModuleType:
    """The problem file as a module of its own (not registered in sys.modules: every problem's
    thread has one, under the same file name)."""
    module = types.ModuleType("kforge_problem")
    module.__file__ = "problem.py"
    exec(compile(problem_source, "problem.py", "exec"), module.__dict__)
    if size_preset:
        module.__dict__.update(getattr(module, "SIZE_PRESETS", {}).get(size_preset, {}))
    return module


def _spec(tensor: Any) -> TensorSpec:
    return TensorSpec(str(tensor.dtype), tuple(tensor.shape))


def _inputs(module: types.ModuleType, seed: int, device: Any) -> list[Any]:
    from tasks.harness import modules

    return modules.make_inputs(module, seed, device)


def _flops(reference: Any, inputs: list[Any]) -> int | None:
    try:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            reference(*inputs)
        return int(counter.get_total_flops())
    except Exception:  # noqa: BLE001 - an op the counter does not know: no FLOP bound
        return None


def make_inputs(runtime: ProblemRuntime, seed: int) -> list[Any]:
    """The problem's inputs drawn from `seed` on the runtime's device (the same every time)."""
    with _generator_lock:
        return _inputs(runtime.module, seed, runtime.device)


def reference_output(runtime: ProblemRuntime, inputs: list[Any]) -> Any:
    """The reference's output for `inputs` (the inputs are not changed: forward gets clones)."""
    import torch

    from tasks.harness import modules

    clones = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
    with runtime.lock, torch.no_grad():
        output = runtime.reference(*clones)
    modules.synchronize(runtime.device)
    return output
