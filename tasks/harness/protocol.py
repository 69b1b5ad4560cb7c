"""The messages between the orchestrator and an evaluation worker, in one place (harness code only).

A worker is started with a `WorkerRequest` (a JSON file). The compile and profile modes answer
with one result file. The `session` mode then holds a conversation over two pipes: the orchestrator sends one
JSON line per step (`layout`, `call`, `echo`, `check`, `compile`, `end`) on the
worker's stdin, and the
worker answers each with one JSON line on the reply pipe. Everything a worker says is a claim: the
orchestrator makes the inputs, writes them into the worker's input buffers just before a call,
clocks the call from its own process and judges the outputs it reads back (tasks/drive.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Every attempt ends in exactly one of these (DESIGN.md, "Outcomes").
OUTCOMES = (
    "generation_failed",
    "compile_error",
    "runtime_error",
    "timeout",
    "shape_mismatch",
    "numerical_mismatch",
    "integrity_violation",
    "correct",
)


def failure(outcome: str, error_class: str, excerpt: str) -> dict[str, Any]:
    """The one shape of a failed stage's result: outcome, error_class and error_excerpt."""
    if outcome not in OUTCOMES or outcome == "correct":
        raise ValueError(f"not a failure outcome: {outcome!r}")
    return {"outcome": outcome, "error_class": error_class, "error_excerpt": excerpt}


# What a session worker builds and runs: the candidate's ModelNew, or the trusted reference Model
# (timed eagerly, then under torch.compile after a `compile` step).
MODEL_KINDS = ("candidate", "reference")
PROFILERS = ("torch", "ncu")


@dataclass(frozen=True)
class WorkerRequest:
    mode: str  # compile | session | profile
    problem_source: str
    candidate_source: str | None
    backend: str
    size_preset: str | None
    init_seed: int
    model: str = "candidate"  # session mode: one of MODEL_KINDS
    threads: int | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    nonce: str | None = None  # compile and profile modes: the result must carry it
    hold: bool = False
    # the GPU its stage runs on, as the orchestrator numbers them, and the CUDA_VISIBLE_DEVICES the
    # worker was started with to make it its cuda:0 (None: the orchestrator's own; tasks/gpus.py)
    gpu_index: int = 0
    visible_devices: str | None = None
    # profile mode (tasks/harness/profiling.py): the inputs' seed, calls before the profiled one, rows
    # kept per section, and which profiler: one of PROFILERS ("ncu": Nsight Compute wraps the worker)
    input_seed: int = 0
    warmup_calls: int = 3
    max_rows: int = 200
    profiler: str = "torch"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerRequest:
        raw = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in raw.items() if key in known})


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * ELEMENT_BYTES[self.dtype]


ELEMENT_BYTES = {
    "torch.float64": 8,
    "torch.float32": 4,
    "torch.float16": 2,
    "torch.bfloat16": 2,
    "torch.int64": 8,
    "torch.int32": 4,
    "torch.int16": 2,
    "torch.int8": 1,
    "torch.uint8": 1,
    "torch.bool": 1,
    "torch.complex64": 8,
}
ALIGN = 4096  # offsets of tensors in a shared buffer file


@dataclass(frozen=True)
class Layout:
    """Where the call's inputs and its output live: on the cpu backend, at byte offsets of one shared
    file (`buffer_path`) both processes map; on GPU backends, in device allocations the worker makes
    and exports as IPC handles (its `layout` reply). Non-tensor inputs travel in each `call` line."""

    inputs: tuple[TensorSpec | None, ...]  # None: a non-tensor argument
    outputs: tuple[TensorSpec, ...]
    output_container: str | None  # None (one tensor), "tuple" or "list"
    buffer_path: str | None = None

    def offsets(self) -> tuple[list[int | None], list[int], int]:
        """(input offsets, output offsets, total bytes) in the shared file."""
        position, input_offsets, output_offsets = 0, [], []
        for spec in self.inputs:
            input_offsets.append(None if spec is None else position)
            position += 0 if spec is None else -(-spec.nbytes // ALIGN) * ALIGN
        for spec in self.outputs:
            output_offsets.append(position)
            position += -(-max(spec.nbytes, 1) // ALIGN) * ALIGN
        return input_offsets, output_offsets, max(position, ALIGN)

    def to_message(self) -> dict[str, Any]:
        return {
            "step": "layout",
            "inputs": [None if s is None else [s.dtype, list(s.shape)] for s in self.inputs],
            "outputs": [[s.dtype, list(s.shape)] for s in self.outputs],
            "output_container": self.output_container,
            "buffer_path": self.buffer_path,
        }

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Layout:
        def spec(item: Any) -> TensorSpec | None:
            return None if item is None else TensorSpec(str(item[0]), tuple(int(n) for n in item[1]))

        return cls(
            inputs=tuple(spec(item) for item in message["inputs"]),
            outputs=tuple(spec(item) for item in message["outputs"]),
            output_container=message.get("output_container"),
            buffer_path=message.get("buffer_path"),
        )


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()
