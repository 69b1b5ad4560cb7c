"""Turn problem and candidate sources into live modules, models and inputs inside the worker."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import torch

BACKEND_DEVICES = {"cpu": "cpu", "cuda": "cuda", "triton": "cuda"}
_cuda_synchronize = torch.cuda.synchronize  # bound before any candidate can replace it


def device_for(backend: str, compile_only: bool = False) -> torch.device:
    """The device `backend`'s kernels run on. The compile stage only builds kernels and constructs
    the models, so on a host without a GPU it gets the CPU: candidates compile on CPU-only hosts."""
    device = torch.device(BACKEND_DEVICES[backend])
    if compile_only and device.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    return device


def load_module(source: str, name: str, workdir: Path, size_preset: str | None = None) -> types.ModuleType:
    """Execute `source` as module `name` from a file in `workdir` (so tracebacks show its lines).

    A problem's optional `SIZE_PRESETS[size_preset]` dict overrides its module-level size constants
    before anything reads them; a preset the file does not define leaves its defaults.
    """
    path = workdir / f"{name}.py"
    path.write_text(source)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    if size_preset:
        overrides = getattr(module, "SIZE_PRESETS", {}).get(size_preset, {})
        module.__dict__.update(overrides)
    return module


def to_device(values: list[Any], device: torch.device) -> list[Any]:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def make_inputs(problem: types.ModuleType, seed: int, device: torch.device) -> list[Any]:
    """The problem's inputs drawn from `seed`, made on `device` (a GPU fills 16M random floats in
    well under a millisecond; the CPU takes a tenth of a second), and moved there if made elsewhere."""
    torch.manual_seed(seed)
    with device:
        inputs = list(problem.get_inputs())
    return to_device(inputs, device)


def build_model(problem: types.ModuleType, model_class: type, init_seed: int, device: torch.device) -> torch.nn.Module:
    """`model_class` (the reference Model or the candidate's ModelNew) built from the problem's init
    inputs under `init_seed`: both get the same seed, so parameters created in the same order are
    identical, whichever process builds them."""
    torch.manual_seed(init_seed)
    init_inputs = list(problem.get_init_inputs())
    torch.manual_seed(init_seed)
    return model_class(*init_inputs).to(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        _cuda_synchronize()
