"""Did the candidate patch the harness? (INTEGRITY.md row 9)

Before the candidate module is imported, the worker records every function and class reachable as
an attribute of the clocks (`time`), of torch's top level, `torch.cuda`, `torch.cuda.Event`,
`torch.Tensor`, `torch.nn.functional`, and of the harness's own modules. After each stage of
candidate code it looks again: any of them replaced (a faster `time.perf_counter`, an
`elapsed_time` that divides, a `compare_outputs` that always agrees) is an integrity violation.
The harness binds its clocks at import and the parent compares outputs itself, so a patch would
not work anyway; refusing it says what the candidate tried.
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional

HARNESS_MODULES = (
    "tasks.harness.checks",
    "tasks.harness.dispatch",
    "tasks.harness.modules",
    "tasks.harness.session",
    "tasks.harness.worker",
    "tasks.harness.guard",
)


def _watched() -> list[tuple[str, Any]]:
    owners: list[tuple[str, Any]] = [
        ("time", time),
        ("torch", torch),
        ("torch.cuda", torch.cuda),
        ("torch.cuda.Event", torch.cuda.Event),
        ("torch.Tensor", torch.Tensor),
        ("torch.nn.functional", torch.nn.functional),
    ]
    owners += [(name, sys.modules[name]) for name in HARNESS_MODULES if name in sys.modules]
    return owners


def snapshot() -> dict[tuple[str, str], tuple[Any, Any]]:
    """(owner, attribute) -> (owner object, the callable it holds now)."""
    bindings = {}
    for label, owner in _watched():
        for name, value in list(vars(owner).items()):
            if callable(value) and not isinstance(value, ModuleType):
                bindings[(label, name)] = (owner, value)
    return bindings


def patched(bindings: dict[tuple[str, str], tuple[Any, Any]]) -> list[str]:
    """The recorded attributes that no longer hold the same object, as 'owner.attribute'."""
    missing = object()
    return [
        f"{label}.{name}"
        for (label, name), (owner, value) in bindings.items()
        if vars(owner).get(name, missing) is not value
    ]
