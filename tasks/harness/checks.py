"""Output comparison: exact structure, shape and dtype; dtype-aware tolerances; no NaN/Inf ever passes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# The one place tolerances live (INTEGRITY.md row 7). An element of a floating-point output passes when
#
#     |actual - expected| <= atol * RMS(expected) + rtol * |expected| + FLOORS[dtype]
#
# where RMS(expected) is the root mean square of the whole expected output (each tensor of a tuple on
# its own). atol is not an absolute tolerance: it is in units of the output's RMS, so the check means
# the same at every scale. A fixed absolute atol (float32 had 1e-4 until a cheat showed the hole)
# passes anything on an output whose elements are smaller than it: a softmax over rows of 32768
# (elements around 3e-5) computed with a crude exp and its outputs truncated to bfloat16 was "correct"
# with a max relative error of 1.06%, where the honest kernel had 4.6e-7.
# - rtol * |expected|: lower-precision arithmetic shows as a relative error on every element: a
#   rounding costs 2**-24 (6e-8) in float32, 2**-11 (4.9e-4) in fp16 and TF32, 2**-8 (3.9e-3) in bf16.
# - atol * RMS: the rounding error of a sum scales with its terms, not with its result, so an element
#   that cancels to near zero still gets the output's scale. Without it an honest float32 matmul
#   summing in another order than the library fails at K=4096 on elements near zero.
# - FLOORS: where the RMS is 0 (an all-zero expected output), only exact or denormal-level differences
#   pass: a flush of a denormal to zero is no error, and no other absolute scale comes from the problem.
#   float16's smallest normal (6.1e-5) is a value real outputs have (a softmax over a wide row is
#   mostly below it), so its floor is two subnormal steps instead.
# Measured (tests/tasks/harness/test_checks.py; worst error as a fraction of the allowed): float32
# matmuls summing one product at a time pass at K=4096 (3%) and K=16384 (6%), softmax rows of 32768
# with one sequential float32 sum per row 43% (peaky rows, most terms below half an ulp of the running
# sum), every kernels_ref kernel on an H200 2.3%. TF32, fp16 and bf16 arithmetic fail on half to all
# of the elements (3x to 80x the allowed), as do softmaxes whose outputs are rounded to bf16, fp16 or
# TF32 or whose exp is computed in fp16 or as a quadratic.
# Limits: an element smaller than atol * RMS is checked only to that absolute level; an error that
# the function damps stays small (sigmoid of a TF32 linear layer came to 99% to 116% of the allowed);
# a float32 kernel whose own rounding reaches 1e-4 relative fails (a sequential sum over 131072 peaky
# softmax terms: 1.8e-4), as it should: that is not float32 accuracy.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # dtype -> (atol in units of the RMS, rtol)
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
FLOORS: dict[torch.dtype, float] = {
    torch.float64: torch.finfo(torch.float64).tiny,
    torch.float32: torch.finfo(torch.float32).tiny,
    torch.float16: 2 * 2.0**-24,
    torch.bfloat16: torch.finfo(torch.bfloat16).tiny,
}


def tolerance_for(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for outputs of `dtype` (atol in units of the output's RMS; see above); integer and
    bool outputs must match exactly."""
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
    rms = _rms(expected_wide)
    base = atol * rms + FLOORS.get(expected.dtype, 0.0)  # the allowed difference of an element that is 0
    if _within(expected_wide, actual_wide, rtol, base):
        return None
    nonfinite = ~torch.isfinite(actual_wide)
    diff = (actual_wide - expected_wide).abs()
    allowed = expected_wide.abs() * rtol + base
    bad_mask = nonfinite | (diff > allowed) | ~torch.isfinite(expected_wide)
    if not bool(bad_mask.any()):
        return None
    finite_diff = torch.where(nonfinite | ~torch.isfinite(diff), torch.zeros_like(diff), diff)
    max_abs = float(finite_diff.max())
    max_rel = float((finite_diff / expected_wide.abs().clamp_min(1e-12)).max())
    worst = float(torch.nan_to_num(finite_diff / allowed, nan=0.0).max())
    first = bad_mask.nonzero()[:5].tolist()
    report = (
        f"{label}: {int(bad_mask.sum())} of {expected.numel()} elements outside atol={atol:g} rtol={rtol:g} "
        f"(allowed |diff| = atol * {rms:.4g}, the output's RMS, + rtol * |expected|); "
        f"max abs err {max_abs:.4g}, max rel err {max_rel:.4g}, worst {worst:.3g}x the allowed, "
        f"non-finite {int(nonfinite.sum())}; first mismatching indices {first}"
    )
    return Mismatch("numerical_mismatch", "nonfinite" if bool(nonfinite.any()) else "values", report)


def _rms(expected: torch.Tensor) -> float:
    """Root mean square of the finite elements, scaled by the largest so the squares neither overflow
    (float32 squares overflow past 1.8e19: an infinite RMS would allow anything) nor underflow."""
    finite = torch.nan_to_num(expected, nan=0.0, posinf=0.0, neginf=0.0)
    peak = float(finite.abs().max())
    if peak == 0.0:
        return 0.0
    return peak * float(torch.linalg.vector_norm(finite.div_(peak))) / expected.numel() ** 0.5


def _within(expected: torch.Tensor, actual: torch.Tensor, rtol: float, base: float) -> bool:
    """The common case, in few passes over the data (outputs reach 64 MB): all finite and close."""
    if not (bool(torch.isfinite(actual).all()) and bool(torch.isfinite(expected).all())):
        return False
    diff = (actual - expected).abs_()
    allowed = expected.abs().mul_(rtol).add_(base)
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
