"""How much device memory a problem's checks cost, and how to fit them in a budget.

KernelBench holds problems of 6.4 GB per tensor (level 1's 19_ReLU: 4096 x 393216 float32). A timing
stage keeps, on the device and across three processes, the orchestrator's inputs and reference
output (made again to judge a sampled call, with a clone of the inputs for the reference's
forward), its copies of the sampled outputs, the copy of each worker's outputs it takes as a call
ends and a comparison's temporaries, and in each worker (the candidate's and the paired
reference's) the parameters, an input and an output buffer and the model's own output. The plan
says which of those stay on the device and which go elsewhere, within `budget_bytes`:

1. everything on the device (the fastest);
2. the sampled outputs copied to host memory (the judging then runs on the host copies);
3. no paired reference beside the candidate (its eager time then comes from the baseline stage).

The checks themselves are never dropped: fewer resident copies, the same defences. A problem that
does not fit even the last plan still runs, and if the device runs out the stage's outcome is
`runtime_error` / `harness_out_of_memory`, naming the bytes and the budget (tasks/drive.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Sampled timed outputs kept until the end of a timing stage (drive.JUDGED_TIMED_CALLS + the last).
KEPT_SAMPLES = 3
# Output-sized temporaries of one comparison (tasks/harness/checks.py: the differences, the allowed
# differences, the finite copy the RMS is taken of).
COMPARE_TEMPORARIES = 3


@dataclass(frozen=True)
class MemoryPlan:
    input_bytes: int
    output_bytes: int
    parameter_bytes: int
    budget_bytes: int | None  # None: no device (the cpu backend), nothing to plan
    samples_on_host: bool
    paired: bool
    stage_bytes: int  # the planned peak of one timing stage on the device, all its processes

    def describe(self) -> str:
        budget = "no budget" if self.budget_bytes is None else f"a budget of {gib(self.budget_bytes)}"
        return (
            f"inputs {gib(self.input_bytes)}, outputs {gib(self.output_bytes)}, parameters "
            f"{gib(self.parameter_bytes)}: a timing stage planned at {gib(self.stage_bytes)} against {budget}"
            f" (sampled outputs on the {'host' if self.samples_on_host else 'device'}, paired reference "
            f"{'on' if self.paired else 'off'})"
        )


def gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"


def stage_bytes(inputs: int, outputs: int, parameters: int, samples_on_host: bool, paired: bool) -> int:
    """The device bytes a timing stage holds at its peak (see the module docstring)."""
    orchestrator = parameters + 3 * inputs + outputs + (0 if samples_on_host else KEPT_SAMPLES * outputs)
    # the copy of each session's outputs taken as a call's clock stops (tasks/drive.py: `_call`)
    orchestrator += outputs * (2 if paired else 1) + COMPARE_TEMPORARIES * outputs
    worker = parameters + inputs + 2 * outputs
    return orchestrator + worker * (2 if paired else 1)


def plan(
    input_bytes: int, output_bytes: int, parameter_bytes: int, budget_bytes: int | None, paired: bool
) -> MemoryPlan:
    """The first of the plans above whose stage fits `budget_bytes` (the last one if none does)."""
    options = [(False, paired), (True, paired)] + ([(True, False)] if paired else [])
    if budget_bytes is None:
        options = options[:1]
    for samples_on_host, with_pair in options:
        needed = stage_bytes(input_bytes, output_bytes, parameter_bytes, samples_on_host, with_pair)
        if budget_bytes is None or needed <= budget_bytes:
            break
    return MemoryPlan(input_bytes, output_bytes, parameter_bytes, budget_bytes, samples_on_host, with_pair, needed)


def device_budget(device: Any, fraction: float, of: str = "free") -> int | None:
    """`fraction` of the device's memory (None on the cpu): of the memory free now (a stage's plan),
    or of its whole memory, `of="total"` (`admission_budget`)."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return int((total if of == "total" else free) * fraction)


def admission_budget(device: Any, fraction: float) -> int | None:
    """What the problems in flight may plan for together: `fraction` of the device's whole memory, not
    of the free memory (the problems' own stages use the rest)."""
    return device_budget(device, fraction, of="total")


def parameter_bytes(model: Any) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def is_out_of_memory(exc: BaseException) -> bool:
    """A device allocation that failed, as torch or the CUDA runtime reports it."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
