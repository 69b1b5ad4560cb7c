"""Output comparison: exact structure, shape and dtype; dtype-aware tolerances; no NaN/Inf ever passes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# The one place tolerances live (INTEGRITY.md row 7). float32 is tight enough that a kernel
# computing in TF32 or half precision behind a float32 reference fails.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
# rtol applies to max(|expected element|, RMS of the expected output): the rounding error of a sum
# scales with its terms, not with its result, so an element that cancels to near zero gets the
# output's scale. Without this an honest float32 matmul summing in another order than the library
# fails at K=4096 (error up to 1e-3 on elements near zero, atol 1e-4); with it, float32 kernels
# summing in any order pass at K=16384 while TF32, fp16 and bf16 arithmetic still fail on thousands
# of elements (measured on 64x64 outputs; tests/tasks/harness/test_checks.py).


def tolerance_for(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for outputs of `dtype`; integer and bool outputs must match exactly."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass
class Mismatch:
    outcome: str  # shape_mismatch | numerical_mismatch | integrity_violation
    error_class: str
    report: str


def as_tensor_list(output: Any) -> list[Any]:
    if isinstance(output, (tuple, list)):
        return list(output)
    return [output]


def compare_outputs(reference: Any, candidate: Any) -> tuple[Mismatch | None, float, float]:
    """Compare a candidate's output with the reference's.

    Returns (mismatch or None, atol, rtol) with the tolerances of the first output.
    """
    expected_list, actual_list = as_tensor_list(reference), as_tensor_list(candidate)
    atol, rtol = tolerance_for(expected_list[0].dtype) if expected_list else (0.0, 0.0)
    if isinstance(reference, (tuple, list)) != isinstance(candidate, (tuple, list)):
        report = f"expected {type(reference).__name__} output, got {type(candidate).__name__}"
        return Mismatch("shape_mismatch", "output_structure", report), atol, rtol
    if len(expected_list) != len(actual_list):
        report = f"expected {len(expected_list)} outputs, got {len(actual_list)}"
        return Mismatch("shape_mismatch", "output_count", report), atol, rtol
    for index, (expected, actual) in enumerate(zip(expected_list, actual_list)):
        mismatch = _compare_one(expected, actual, index)
        if mismatch:
            return mismatch, atol, rtol
    return None, atol, rtol


def _compare_one(expected: torch.Tensor, actual: Any, index: int) -> Mismatch | None:
    label = f"output {index}"
    # Exactly torch.Tensor: a subclass can defer or fake its work (INTEGRITY.md row 4).
    if type(actual) is not torch.Tensor:
        return Mismatch("integrity_violation", "not_a_tensor", f"{label} is {type(actual).__name__}, not torch.Tensor")
    if actual.shape != expected.shape:
        report = f"{label}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}"
        return Mismatch("shape_mismatch", "shape", report)
    if actual.dtype != expected.dtype:
        return Mismatch("shape_mismatch", "dtype", f"{label}: expected dtype {expected.dtype}, got {actual.dtype}")
    if actual.device != expected.device:
        report = f"{label}: expected device {expected.device}, got {actual.device}"
        return Mismatch("shape_mismatch", "device", report)
    atol, rtol = tolerance_for(expected.dtype)
    if not expected.is_floating_point():
        if torch.equal(expected, actual):
            return None
        bad = (expected != actual).nonzero()
        report = f"{label}: {bad.shape[0]} of {expected.numel()} elements differ; first at {bad[:5].tolist()}"
        return Mismatch("numerical_mismatch", "values", report)
    # float32 arithmetic is exact enough at these tolerances and half the memory traffic of float64
    wide = torch.float64 if expected.dtype == torch.float64 else torch.float32
    expected_wide, actual_wide = expected.to(wide), actual.to(wide)
    if expected.numel() == 0:
        return None
    scale = torch.linalg.vector_norm(torch.nan_to_num(expected_wide, nan=0.0, posinf=0.0, neginf=0.0))
    scale = float(scale) / expected.numel() ** 0.5  # the output's RMS
    if _within(expected_wide, actual_wide, atol, rtol, scale):
        return None
    nonfinite = ~torch.isfinite(actual_wide)
    diff = (actual_wide - expected_wide).abs()
    allowed = atol + rtol * expected_wide.abs().clamp_min(scale)
    bad_mask = nonfinite | (diff > allowed) | ~torch.isfinite(expected_wide)
    if not bool(bad_mask.any()):
        return None
    finite_diff = torch.where(nonfinite, torch.zeros_like(diff), diff)
    max_abs = float(finite_diff.max())
    max_rel = float((finite_diff / expected_wide.abs().clamp_min(1e-12)).max())
    first = bad_mask.nonzero()[:5].tolist()
    report = (
        f"{label}: {int(bad_mask.sum())} of {expected.numel()} elements outside atol={atol:g} rtol={rtol:g}; "
        f"max abs err {max_abs:.4g}, max rel err {max_rel:.4g}, non-finite {int(nonfinite.sum())}; "
        f"first mismatching indices {first}"
    )
    return Mismatch("numerical_mismatch", "nonfinite" if bool(nonfinite.any()) else "values", report)


def _within(expected: torch.Tensor, actual: torch.Tensor, atol: float, rtol: float, scale: float) -> bool:
    """The common case, in few passes over the data (outputs reach 64 MB): all finite and close."""
    if not (bool(torch.isfinite(actual).all()) and bool(torch.isfinite(expected).all())):
        return False
    diff = (actual - expected).abs_()
    allowed = expected.abs().clamp_min_(scale).mul_(rtol).add_(atol)
    return not bool((diff > allowed).any())


def first_error_stats(reference: Any, candidate: Any) -> dict[str, float]:
    """Max absolute and relative error over all outputs (for the record, even when they pass)."""
    max_abs = max_rel = 0.0
    for expected, actual in zip(as_tensor_list(reference), as_tensor_list(candidate)):
        if not (isinstance(actual, torch.Tensor) and actual.shape == expected.shape and expected.numel()):
            continue
        wide = torch.float64 if expected.dtype == torch.float64 else torch.float32
        diff = torch.nan_to_num((actual.to(wide) - expected.to(wide)).abs(), nan=0.0, posinf=0.0)
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / expected.to(wide).abs().clamp_min(1e-12)).max()))
    return {"max_abs_err": max_abs, "max_rel_err": max_rel}
