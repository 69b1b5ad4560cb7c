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

    assert mismatch.report.startswith(
        "output 0: 2 of 1000 elements outside atol=0.0001 rtol=0.0001 "
        "(allowed |diff| = atol * 0.9761, the output's RMS, + rtol * |expected|); "
    )
    assert "max abs err 0.5," in mismatch.report
    assert "worst 2.62e+03x the allowed," in mismatch.report
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


def _truncate_mantissa(values: torch.Tensor, kept_bits: int) -> torch.Tensor:
    """float32 values with all but `kept_bits` mantissa bits cleared (7: bf16 by truncation)."""
    return (values.contiguous().view(torch.int32) & ~((1 << (23 - kept_bits)) - 1)).view(torch.float32)


def failing_elements(expected: torch.Tensor, actual: torch.Tensor) -> int:
    mismatch, _, _ = compare_outputs(expected, actual)
    if mismatch is None:
        return 0
    assert (mismatch.outcome, mismatch.error_class) == ("numerical_mismatch", "values"), mismatch
    return int(mismatch.report.split(": ", 1)[1].split(" of ")[0])


@pytest.mark.parametrize("k", [4096, 16384])
def test_a_long_sum_in_another_order_passes_and_reduced_precision_does_not(k):
    # 64x64 outputs of a K-long product: values about sqrt(K), many elements cancel to near zero.
    generator = torch.Generator().manual_seed(5)
    a, b = torch.randn(64, k, generator=generator), torch.randn(k, 64, generator=generator)
    expected = a @ b
    sequential = torch.zeros(64, 64)  # one product at a time: rounding grows with K, unlike BLAS
    for p in range(0, k):
        sequential += a[:, p : p + 1] * b[p : p + 1, :]
    assert float((sequential - expected).abs().max()) > 2e-4  # beyond 1e-4 where elements are near zero

    assert compare_outputs(expected, sequential)[0] is None
    assert compare_outputs(expected, (a.double() @ b.double()).float())[0] is None
    # TF32 inputs (rounded or truncated), fp16 inputs, bf16 inputs, all with float32 accumulation:
    # measured 2230 to 4035 of the 4096 elements fail; an output rounded to TF32 fails on about 1000.
    reduced = {
        "tf32": _round_mantissa(a, 10) @ _round_mantissa(b, 10),
        "tf32 truncated": _truncate_mantissa(a, 10) @ _truncate_mantissa(b, 10),
        "fp16": a.half().float() @ b.half().float(),
        "bf16": _round_mantissa(a, 7) @ _round_mantissa(b, 7),
        "output rounded to tf32": _round_mantissa(expected.clone(), 10),
    }
    for name, actual in reduced.items():
        assert failing_elements(expected, actual) > 500, name


# --- softmax over wide rows: elements far below any fixed absolute tolerance ---------------------

SOFTMAX_WIDTHS = [4096, 32768]


def softmax_inputs(width: int, spread: float) -> torch.Tensor:
    """8 rows of `width` logits; spread 4 makes peaky rows, with most elements far below the RMS."""
    return torch.randn(8, width, generator=torch.Generator().manual_seed(width)) * spread


def _polynomial_exp(x: torch.Tensor) -> torch.Tensor:
    """A crude exp: 2**floor(t) times a quadratic in the fraction (0.2% error)."""
    t = x * 1.4426950408889634
    whole = torch.floor(t)
    fraction = t - whole
    return (1 + fraction * (0.6565 + 0.344 * fraction)) * torch.pow(2.0, whole)


def _normalized(z: torch.Tensor) -> torch.Tensor:
    return z / z.sum(-1, keepdim=True)


def _sequential_row_sums(z: torch.Tensor) -> torch.Tensor:
    """One float32 running sum per row, one element at a time (a naive thread-per-row kernel)."""
    total = torch.zeros(z.shape[0])
    for column in z.unbind(1):
        total += column
    return total.unsqueeze(1)


@pytest.mark.parametrize("spread", [1.0, 4.0])
@pytest.mark.parametrize("width", SOFTMAX_WIDTHS)
def test_a_softmax_in_lower_precision_fails_whatever_the_scale_of_its_elements(width, spread):
    x = softmax_inputs(width, spread)
    expected = torch.softmax(x, -1)
    shifted = x - x.max(-1, keepdim=True).values
    cheats = {
        "outputs truncated to bf16": _truncate_mantissa(expected, 7),
        "outputs rounded to bf16": expected.bfloat16().float(),
        "outputs rounded to fp16": expected.half().float(),
        "outputs rounded to tf32": _round_mantissa(expected.clone(), 10),
        "exp in fp16": _normalized(torch.exp(shifted.half()).float()),
        "polynomial exp": _normalized(_polynomial_exp(shifted)),
        "polynomial exp, outputs truncated to bf16": _truncate_mantissa(_normalized(_polynomial_exp(shifted)), 7),
    }
    for name, actual in cheats.items():
        # measured: at least 83 of 32768 elements (fp16 outputs of peaky rows), most often thousands
        assert failing_elements(expected, actual) >= 50, name
        if spread == 1.0:  # each got through the old rule, whose absolute 1e-4 exceeds most elements
            old_allowed = 1e-4 + 1e-4 * expected.abs().clamp_min(float(expected.square().mean().sqrt()))
            assert bool(((actual - expected).abs() <= old_allowed).all()), name


@pytest.mark.parametrize("spread", [1.0, 4.0])
@pytest.mark.parametrize("width", SOFTMAX_WIDTHS)
def test_an_honest_float32_softmax_in_another_order_passes(width, spread):
    x = softmax_inputs(width, spread)
    expected = torch.softmax(x, -1)
    z = torch.exp(x - x.max(-1, keepdim=True).values)
    honest = {
        "in float64": torch.softmax(x.double(), -1).float(),
        "chunked sums": z / z.view(8, -1, 256).sum(-1).sum(-1, keepdim=True),
        "times the reciprocal": z * (1 / z.sum(-1, keepdim=True)),
        # the worst: 32768 peaky terms, most below half an ulp of the running sum; 5e-5 relative,
        # half of the allowed
        "sequential sums": z / _sequential_row_sums(z),
    }
    for name, actual in honest.items():
        assert compare_outputs(expected, actual)[0] is None, name


# --- zeros ----------------------------------------------------------------------------------------


def test_relu_outputs_with_many_exact_zeros():
    generator = torch.Generator().manual_seed(11)
    a, b = torch.randn(64, 4096, generator=generator), torch.randn(4096, 64, generator=generator)
    expected = torch.relu(a @ b)  # half the elements exactly 0
    assert float((expected == 0).float().mean()) > 0.4
    # float32 in another order: pre-activations near zero may land on the other side of it
    assert compare_outputs(expected, torch.relu((a.double() @ b.double()).float()))[0] is None

    # a zero where the reference has one is judged against the output's scale, not against nothing
    leaky = torch.where(expected == 0, 1e-3 * expected.max(), expected)
    assert failing_elements(expected, leaky) == int((expected == 0).sum())
    assert failing_elements(expected, expected.bfloat16().float()) > 500


def test_an_all_zero_expected_output_allows_only_denormal_level_differences():
    # RMS 0 gives no scale: any absolute scale would be the hole this tolerance closes, so only exact
    # zeros (either sign) and denormals (a flush to zero, or its opposite) pass.
    expected = torch.zeros(1000)
    assert compare_outputs(expected, torch.zeros(1000))[0] is None
    assert compare_outputs(expected, -torch.zeros(1000))[0] is None
    assert compare_outputs(expected, torch.full((1000,), 1e-40))[0] is None

    for value in (1e-30, 1e-7, 1.0):
        assert failing_elements(expected, torch.full((1000,), value)) == 1000, value
    one_off = expected.clone()
    one_off[3] = 1e-20
    assert failing_elements(expected, one_off) == 1


def test_the_scale_of_a_huge_or_tiny_output_is_not_infinite_or_zero():
    # float32 squares overflow past 1.8e19: an infinite RMS would have allowed any finite output
    for magnitude in (1e30, 1e-30):
        expected = reference_values() * magnitude
        assert compare_outputs(expected, expected * (1 + 5e-5))[0] is None, magnitude
        assert failing_elements(expected, expected * 1.01) > 500, magnitude
        assert failing_elements(expected, torch.zeros_like(expected)) > 900, magnitude


# --- half-precision references keep their looser tolerances ---------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_honest_kernel_computing_in_half_precision_passes_a_half_precision_reference(dtype):
    generator = torch.Generator().manual_seed(13)
    a = torch.randn(64, 4096, generator=generator).to(dtype)
    b = torch.randn(4096, 64, generator=generator).to(dtype)
    expected = (a.float() @ b.float()).to(dtype)  # float32 accumulation, one rounding at the end
    sequential = torch.zeros(64, 64)
    for p in range(0, 4096, 64):  # another order, still float32 accumulation
        sequential += a[:, p : p + 64].float() @ b[p : p + 64, :].float()
    assert compare_outputs(expected, sequential.to(dtype))[0] is None

    # elementwise GELU with every step rounded to the dtype, against one rounding of the float32 result
    x = (torch.randn(4096, generator=generator) * 3).to(dtype)
    reference = torch.nn.functional.gelu(x.float()).to(dtype)
    stepwise = x * (torch.erf(x * torch.tensor(0.7071067811865476, dtype=dtype)) + 1) * torch.tensor(0.5, dtype=dtype)
    assert stepwise.dtype == dtype
    assert compare_outputs(reference, stepwise)[0] is None

    # a softmax over a wide row, computed in float32 and rounded: fp16 elements are mostly subnormal here
    logits = torch.randn(8, 32768, generator=generator).to(dtype)
    assert compare_outputs(torch.softmax(logits, -1), torch.softmax(logits.double(), -1).to(dtype))[0] is None
    # and a tenth of the output lost still fails
    assert failing_elements(expected, (sequential * 0.9).to(dtype)) > 500
