"""Roofline bounds (INTEGRITY.md row 19): the peak table, the CPU measurement, the byte and FLOP counts,
and the verdicts, on hand-made numbers and on a real ReLU timed on this machine."""

import math
import statistics
import time

import pytest
import torch

from tasks.roofline import (
    CACHE_BANDWIDTH_FACTOR,
    MEASURED_SAFETY_FACTOR,
    MIN_FLUSH_BYTES,
    DevicePeak,
    assess,
    bounds,
    device_peak,
    flush_bytes,
    measured_peak,
    problem_bytes,
    reference_flops,
    scale_measured,
    table_peak,
)

MIB = 1024 * 1024


def test_h200_is_found_by_its_torch_name_with_its_datasheet_numbers():
    peak = device_peak("NVIDIA H200")
    assert peak.source == "table"
    assert peak.name == "NVIDIA H200"
    assert peak.memory_bandwidth == 4.8e12
    assert peak.fp32_flops == 67e12
    assert peak.tf32_tensor_flops == 494.5e12
    assert peak.bf16_tensor_flops == 989.5e12
    assert peak.fp16_tensor_flops == 989.5e12
    assert peak.best_compute_flops == 989.5e12
    assert peak.llc_bytes == 60 * MIB
    assert flush_bytes(peak) == 120 * MIB


def test_h100_sxm_is_found_by_its_torch_name_with_its_datasheet_numbers():
    peak = device_peak("NVIDIA H100 80GB HBM3")
    assert (peak.source, peak.name) == ("table", "NVIDIA H100 80GB HBM3")
    assert peak.memory_bandwidth == 3.35e12
    assert peak.fp32_flops == 67e12
    assert peak.bf16_tensor_flops == 989.5e12
    assert peak.llc_bytes == 50 * MIB
    assert flush_bytes(peak) == 100 * MIB


def test_names_match_whole_words_case_insensitively_and_ambiguity_takes_the_family_maximum():
    assert device_peak("nvidia h200 nvl").name == "NVIDIA H200 NVL"
    assert device_peak("NVIDIA L4").memory_bandwidth == 0.3e12
    assert device_peak("NVIDIA L40S").memory_bandwidth == 0.864e12
    assert device_peak("NVIDIA A10G").name == "NVIDIA A10G"
    assert device_peak("NVIDIA A100-SXM4-40GB").memory_bandwidth == 1.555e12
    assert device_peak("NVIDIA A100 80GB PCIe").memory_bandwidth == 1.935e12
    # "L4" is not inside "L40": an L40 must not get the (lower) L4 peaks.
    assert table_peak("NVIDIA L40") is None
    # A MIG slice carries its parent's name: the whole GPU's peaks are a generous bound for it.
    assert device_peak("NVIDIA H100 80GB HBM3 MIG 1g.10gb").name == "NVIDIA H100 80GB HBM3"
    # A bare family name takes every field's maximum over the family: NVL bandwidth, SXM compute.
    bare = device_peak("NVIDIA H100")
    assert bare.memory_bandwidth == 3.9e12
    assert bare.fp32_flops == 67e12
    assert bare.bf16_tensor_flops == 989.5e12


def test_an_unknown_name_falls_back_to_measuring_this_cpu():
    peak = device_peak("Acme Accelerator 9000")
    assert peak.source == "measured"
    assert peak is measured_peak("cpu")  # measured once per process
    assert peak.memory_bandwidth > 1e9
    assert peak.fp32_flops > 1e9
    assert peak.best_compute_flops >= peak.fp32_flops
    # This host has private caches inside its last level (sysfs): the innermost is charged at 16x memory
    # bandwidth at least, the last level at memory bandwidth at least.
    assert peak.inner_cache_bytes > 0
    assert peak.inner_cache_bandwidth >= CACHE_BANDWIDTH_FACTOR * peak.memory_bandwidth
    assert peak.cache_bandwidth >= peak.memory_bandwidth
    assert peak.llc_bytes > 0
    assert flush_bytes(peak) >= max(2 * peak.llc_bytes, MIN_FLUSH_BYTES)
    assert device_peak("cpu") is peak


def test_measured_peaks_are_scaled_up_by_the_safety_factor():
    raw = DevicePeak("cpu", 10e9, 100e9, 100e9, 400e9, 50e9, 32 * MIB, "measured", cache_bandwidth=500e9)
    scaled = scale_measured(raw)
    assert scaled.source == "measured"
    assert scaled.memory_bandwidth == MEASURED_SAFETY_FACTOR * 10e9
    assert scaled.fp32_flops == MEASURED_SAFETY_FACTOR * 100e9
    assert scaled.bf16_tensor_flops == MEASURED_SAFETY_FACTOR * 400e9
    assert scaled.best_compute_flops == MEASURED_SAFETY_FACTOR * 400e9
    assert scaled.cache_bandwidth == MEASURED_SAFETY_FACTOR * 500e9  # the measured cache copy, scaled
    assert scaled.llc_bytes == raw.llc_bytes
    assert flush_bytes(scaled) == MIN_FLUSH_BYTES  # 2 x 32 MiB is not over the 64 MiB minimum
    # The innermost cache is never charged below 16x memory bandwidth: a copy small enough to stay in it
    # is short enough for torch's per-call overhead to hide its speed.
    slow = scale_measured(DevicePeak("cpu", 10e9, 1e9, 1e9, 1e9, 1e9, 32 * MIB, "measured", cache_bandwidth=50e9))
    assert slow.cache_bandwidth == CACHE_BANDWIDTH_FACTOR * MEASURED_SAFETY_FACTOR * 10e9
    tiered = scale_measured(DevicePeak("cpu", 10e9, 1e9, 1e9, 1e9, 1e9, 32 * MIB, "measured", 30e9, 4 * MIB, 100e9))
    assert tiered.cache_bandwidth == MEASURED_SAFETY_FACTOR * 30e9
    assert tiered.inner_cache_bandwidth == CACHE_BANDWIDTH_FACTOR * MEASURED_SAFETY_FACTOR * 10e9
    assert flush_bytes(tiered) == 72 * MIB  # twice the 4 + 32 MiB of cache


def test_problem_bytes_counts_tensors_once_and_everything_else_as_zero():
    x = torch.zeros(10, 3)  # 120 bytes
    h = torch.zeros(4, dtype=torch.float16)  # 8 bytes
    assert problem_bytes([x], x) == (120, 120)
    assert problem_bytes([x, h], (x, h)) == (128, 128)
    assert problem_bytes([3, 2.5, "mode", None, x], [h]) == (120, 8)
    assert problem_bytes([], ()) == (0, 0)
    # The same tensor twice, and views that together cover it, are one tensor's bytes.
    assert problem_bytes([x, x], x.chunk(2)) == (120, 120)
    # An expanded view writes only what it owns; a strided view does not own its gaps.
    row = torch.zeros(1, 3)
    assert problem_bytes([], row.expand(1000, 3)) == (0, 12)
    assert problem_bytes([], x[:, ::2]) == (0, 80)


def test_reference_flops_counts_a_linear_layer_and_nothing_for_relu():
    batch, n_in, n_out = 8, 32, 16
    assert reference_flops(torch.nn.Linear(n_in, n_out), [torch.randn(batch, n_in)]) == 2 * batch * n_in * n_out
    # FlopCounterMode has formulas for matmuls, convolutions and attention only: ReLU counts 0 (the count
    # succeeded and found nothing), not None (which means the forward or the counting failed).
    assert reference_flops(torch.nn.ReLU(), [torch.randn(batch, n_in)]) == 0
    assert reference_flops(torch.nn.Linear(n_in, n_out), [torch.randn(batch, n_in + 1)]) is None


# 1 GB/s to DRAM, 15 GB/s into a 1 MB cache (16 GB/s into cache or DRAM), 1 GFLOP/s at best.
HAND = DevicePeak("hand", 1e9, 0.5e9, 1e9, 1e9, 1e9, 1_000_000, "table", cache_bandwidth=15e9)
# A CPU-like hierarchy: 1 MB of private caches at 12 GB/s, a 10 MB last level at 3 GB/s, DRAM at 1 GB/s.
TIERED = DevicePeak("tiered", 1e9, 1e9, 1e9, 1e9, 1e9, 10_000_000, "measured", 3e9, 1_000_000, 12e9)


def test_bounds_and_verdicts_on_hand_made_numbers():
    # 11 MB out: 10 MB cannot stay in the 1 MB cache, so 10 ms at least; 5 + 11 MB moved once: 16 ms;
    # 2e7 FLOPs at 1 GFLOP/s: 20 ms, the roofline.
    b = bounds(HAND, input_bytes=5_000_000, output_bytes=11_000_000, flops=20_000_000)
    assert b.write_floor_ms == pytest.approx(10.0)
    assert b.memory_ms == pytest.approx(16.0)
    assert b.compute_ms == pytest.approx(20.0)
    assert b.roofline_ms == pytest.approx(20.0)
    verdict, fraction = assess(5.0, b)
    assert verdict == "impossible" and fraction == pytest.approx(4.0)
    verdict, fraction = assess(12.0, b)
    assert verdict == "suspect" and fraction == pytest.approx(20.0 / 12.0)
    verdict, fraction = assess(40.0, b)
    assert verdict == "ok" and fraction == pytest.approx(0.5)
    assert assess(b.roofline_ms, b) == ("ok", pytest.approx(1.0))
    assert assess(b.write_floor_ms, b)[0] == "suspect"
    assert assess(0.0, b) == ("impossible", math.inf)
    with pytest.raises(ValueError):
        assess(float("nan"), b)
    # Without FLOPs the bytes decide: 16 ms.
    assert bounds(HAND, 5_000_000, 11_000_000, None).roofline_ms == pytest.approx(16.0)


def test_outputs_that_fit_in_cache_are_charged_at_cache_bandwidth_in_the_write_floor():
    # 0.8 MB out fits in the 1 MB cache: only the 16 GB/s write into cache or DRAM is certain (0.05 ms),
    # while the roofline still moves it once at memory bandwidth (0.8 ms).
    b = bounds(HAND, input_bytes=0, output_bytes=800_000, flops=None)
    assert b.write_floor_ms == pytest.approx(0.05)
    assert b.roofline_ms == pytest.approx(0.8)
    assert b.compute_ms == 0.0
    assert assess(0.04, b)[0] == "impossible"
    assert assess(0.06, b)[0] == "suspect"
    assert assess(0.9, b)[0] == "ok"
    b = bounds(HAND, input_bytes=4_000_000, output_bytes=800_000, flops=0)
    assert b.roofline_ms == pytest.approx(4.8)
    assert assess(1.0, b)[0] == "suspect"
    # Nothing to move and nothing counted: no fraction.
    assert assess(1.0, bounds(HAND, 0, 0, None)) == ("ok", None)


def test_each_cache_level_only_holds_its_capacity():
    # 21 MB out: 20 MB past the private caches enter the last level or DRAM at 4 GB/s at most (5 ms);
    # 10 MB past all caches reach DRAM at 1 GB/s (10 ms), the floor.
    b = bounds(TIERED, input_bytes=0, output_bytes=21_000_000, flops=None)
    assert b.write_floor_ms == pytest.approx(10.0)
    # 5 MB out: 4 MB past the private caches, at 4 GB/s: 1 ms.
    b = bounds(TIERED, input_bytes=0, output_bytes=5_000_000, flops=None)
    assert b.write_floor_ms == pytest.approx(1.0)
    # 0.5 MB out: all of it may sit in the private caches: 0.5 MB at 16 GB/s.
    assert bounds(TIERED, 0, 500_000, None).write_floor_ms == pytest.approx(0.03125)


def _median_ms_after_flush(fn, flush):
    """Median of 5 perf_counter timings of fn, each after a cache flush (as the harness times); fn's last result."""
    times = []
    for run in range(5):
        flush.fill_(run)
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), result


def test_an_honest_cpu_relu_is_ok_and_a_time_1000x_shorter_is_impossible():
    peak = measured_peak("cpu")
    x = torch.randn(16 * 1024 * 1024)
    out = torch.zeros_like(x)
    flush = torch.empty(flush_bytes(peak), dtype=torch.uint8)
    relu_ms, y = _median_ms_after_flush(lambda: torch.relu(x), flush)
    relu_out_ms, _ = _median_ms_after_flush(lambda: torch.clamp_min(x, 0.0, out=out), flush)
    # Write-only, into a buffer already paged in: the honest kernel nearest the write floor.
    zero_ms, _ = _median_ms_after_flush(out.zero_, flush)
    del flush
    b = bounds(peak, *problem_bytes([x], y), reference_flops(torch.nn.ReLU(), [x]))
    assert (b.input_bytes, b.output_bytes, b.flops) == (64 * MIB, 64 * MIB, 0)
    for runtime_ms in (relu_ms, relu_out_ms):
        verdict, fraction = assess(runtime_ms, b)
        assert verdict == "ok", (runtime_ms, b, peak)
        assert 0 < fraction <= 1
    assert assess(zero_ms, bounds(peak, *problem_bytes([], out), None))[0] == "ok", (zero_ms, peak)
    assert assess(relu_ms / 1000, b)[0] == "impossible", (relu_ms, b, peak)
    assert assess(relu_out_ms / 1000, b)[0] == "impossible", (relu_out_ms, b, peak)
