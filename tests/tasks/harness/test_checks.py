"""compare_outputs in process: structure, shape, dtype, dtype-aware tolerances, no NaN or Inf ever passing."""

import pytest
import torch

from tasks.harness.checks import compare_outputs, tolerance_for


def reference_values(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(1000, generator=generator, dtype=torch.float64).to(dtype)


def scaled(values: torch.Tensor, relative_error: float) -> torch.Tensor:
    return (values.double() * (1 + relative_error)).to(values.dtype)


@pytest.mark.parametrize(
    ("dtype", "passing_error", "failing_error"),
    [
        (torch.float64, 1e-8, 1e-5),
        (torch.float32, 5e-5, 1e-3),
        (torch.float16, 5e-3, 3e-2),
        (torch.bfloat16, 1e-2, 5e-2),
    ],
)
def test_tolerance_follows_the_reference_dtype(dtype, passing_error, failing_error):
    expected = reference_values(dtype)

    mismatch, atol, rtol = compare_outputs(expected, scaled(expected, passing_error))
    assert mismatch is None
    assert (atol, rtol) == tolerance_for(dtype)

    mismatch, _, _ = compare_outputs(expected, scaled(expected, failing_error))
    assert (mismatch.outcome, mismatch.error_class) == ("numerical_mismatch", "values")


def test_half_precision_error_passes_in_fp16_but_not_behind_a_float32_reference():
    # A kernel that computes in fp16 behind a float32 reference must not hide in a loose tolerance.
    expected = reference_values(torch.float32)
    through_half = expected.half().float() * (1 + 5e-3)
    assert compare_outputs(expected.half(), through_half.half())[0] is None

    mismatch, atol, rtol = compare_outputs(expected, through_half)
    assert mismatch.outcome == "numerical_mismatch"
    assert (atol, rtol) == (1e-4, 1e-4)


def test_mismatch_report_gives_count_errors_and_first_indices():
    expected = reference_values()
    actual = expected.clone()
    actual[[17, 400]] += 0.5

    mismatch, _, _ = compare_outputs(expected, actual)

    assert mismatch.report.startswith("output 0: 2 of 1000 elements outside atol=0.0001 rtol=0.0001; ")
    assert "max abs err 0.5," in mismatch.report
    assert "non-finite 0;" in mismatch.report
    assert mismatch.report.endswith("first mismatching indices [[17], [400]]")


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_candidate_values_fail(bad_value):
    expected = reference_values()
    actual = expected.clone()
    actual[5] = bad_value

    mismatch, _, _ = compare_outputs(expected, actual)

    assert (mismatch.outcome, mismatch.error_class) == ("numerical_mismatch", "nonfinite")
    assert "non-finite 1;" in mismatch.report
    assert mismatch.report.endswith("first mismatching indices [[5]]")


def test_nan_fails_even_where_the_reference_is_nan_too():
    # Documented policy: no NaN ever passes, so a NaN copied from the reference is no excuse.
    expected = reference_values()
    expected[9] = float("nan")

    mismatch, _, _ = compare_outputs(expected, expected.clone())

    assert mismatch.outcome == "numerical_mismatch"
    assert mismatch.report.endswith("first mismatching indices [[9]]")


def test_tuple_outputs_are_compared_element_by_element():
    first, second = reference_values(), reference_values() * 3

    assert compare_outputs((first, second), [first.clone(), second.clone()])[0] is None

    wrong_second = second.clone()
    wrong_second[0] += 1
    mismatch, _, _ = compare_outputs((first, second), (first.clone(), wrong_second))
    assert mismatch.outcome == "numerical_mismatch"
    assert mismatch.report.startswith("output 1: 1 of 1000 elements")


def test_output_count_mismatch():
    values = reference_values()

    mismatch, _, _ = compare_outputs((values, values), (values.clone(),))

    assert (mismatch.outcome, mismatch.error_class, mismatch.report) == (
        "shape_mismatch",
        "output_count",
        "expected 2 outputs, got 1",
    )


def test_shape_and_dtype_must_match_exactly():
    values = reference_values()

    mismatch, _, _ = compare_outputs(values, values.reshape(10, 100))
    assert (mismatch.outcome, mismatch.error_class) == ("shape_mismatch", "shape")
    assert mismatch.report == "output 0: expected shape (1000,), got (10, 100)"

    mismatch, _, _ = compare_outputs(values, values.double())
    assert (mismatch.outcome, mismatch.error_class) == ("shape_mismatch", "dtype")


def test_tensor_subclass_is_an_integrity_violation():
    class Deferred(torch.Tensor):
        pass

    values = reference_values()

    mismatch, _, _ = compare_outputs(values, values.clone().as_subclass(Deferred))

    assert (mismatch.outcome, mismatch.error_class) == ("integrity_violation", "not_a_tensor")
    assert mismatch.report == "output 0 is Deferred, not torch.Tensor"


def test_integer_outputs_must_be_exact():
    expected = torch.arange(100, dtype=torch.int64)
    assert tolerance_for(torch.int64) == (0.0, 0.0)
    assert compare_outputs(expected, expected.clone())[0] is None

    off_by_one = expected.clone()
    off_by_one[42] += 1
    mismatch, _, _ = compare_outputs(expected, off_by_one)

    assert (mismatch.outcome, mismatch.error_class) == ("numerical_mismatch", "values")
    assert mismatch.report == "output 0: 1 of 100 elements differ; first at [[42]]"


def test_a_list_is_not_a_tensor_and_a_tensor_is_not_a_tuple():
    values = reference_values()
    as_list, _, _ = compare_outputs(values, [values.clone()])
    assert (as_list.outcome, as_list.error_class, as_list.report) == (
        "shape_mismatch",
        "output_structure",
        "expected Tensor output, got list",
    )
    as_tensor, _, _ = compare_outputs((values,), values.clone())
    assert (as_tensor.outcome, as_tensor.error_class) == ("shape_mismatch", "output_structure")


def _round_mantissa(values: torch.Tensor, kept_bits: int) -> torch.Tensor:
    """float32 values rounded to `kept_bits` mantissa bits (10: TF32, 7: bf16)."""
    dropped = 23 - kept_bits
    bits = values.view(torch.int32)
    return ((bits + (1 << (dropped - 1))) & ~((1 << dropped) - 1)).view(torch.float32)


def test_a_long_sum_in_another_order_passes_and_reduced_precision_does_not():
    # 64x64 outputs of a K=4096 product: values about 64, many elements cancel to near zero.
    generator = torch.Generator().manual_seed(5)
    a, b = torch.randn(64, 4096, generator=generator), torch.randn(4096, 64, generator=generator)
    expected = a @ b
    sequential = torch.zeros(64, 64)  # one product at a time: rounding grows with K, unlike BLAS
    for p in range(0, 4096):
        sequential += a[:, p : p + 1] * b[p : p + 1, :]
    assert float((sequential - expected).abs().max()) > 2e-4  # beyond atol where elements are near zero

    assert compare_outputs(expected, sequential)[0] is None
    for kept_bits in (10, 7):  # TF32, bf16 inputs with float32 accumulation
        reduced = _round_mantissa(a, kept_bits) @ _round_mantissa(b, kept_bits)
        mismatch, _, _ = compare_outputs(expected, reduced)
        assert mismatch is not None and mismatch.outcome == "numerical_mismatch", kept_bits
