"""tasks/distill.py on a real Nsight Compute 2025.3.1 report from an H200 (tests/data/ncu_details_h200.csv: a
clamp, a softmax, a cutlass sgemm and a cublasLt splitK reduce) and on hand-made torch.profiler rows; the
chart it draws; and the one-line error for a broken metrics file."""

import io
import json
from pathlib import Path

import matplotlib.image
import pytest

from tasks import distill, knowledge
from tasks.ncu import parse_details

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "tests" / "data" / "ncu_details_h200.csv"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def h200_rows():
    rows, left_out = parse_details(REPORT.read_text(), 20)
    assert not left_out
    return [{**r, "tool": "ncu", "tool_version": "2025.3.1.0"} for r in rows]


@pytest.fixture(scope="module")
def h200(h200_rows):
    return distill.distil({"runtime_ms": 0.1, "roofline_fraction": 0.25}, h200_rows, min_bytes=32e6)


def test_durations_are_read_in_ns_so_each_kernel_weighs_its_own_time(h200):
    durations = sorted(k.duration_us for k in h200.kernels)
    assert durations == pytest.approx([6.784, 9.696, 15.872, 49.888])  # the report's ns, as us
    assert sum(k.share for k in h200.kernels) == pytest.approx(1.0)
    assert h200.kernels[0].name.startswith("void cutlass::Kernel2<cutlass_80_simt_sgemm")  # most time first
    assert h200.kernels[0].share == pytest.approx(49.888 / 82.24)


def test_the_rule_metrics_are_the_reports_values_weighted_by_duration(h200):
    dram = {"clamp": 37.44, "SoftMax": 23.0, "sgemm": 9.33, "splitK": 51.68}
    weighted = sum(
        dram[k] * us for k, us in (("clamp", 9.696), ("SoftMax", 15.872), ("sgemm", 49.888), ("splitK", 6.784))
    )
    assert h200.metrics["dram_throughput_pct"] == pytest.approx(weighted / 82.24)
    assert h200.metrics["dram_throughput_pct"] != pytest.approx(sum(dram.values()) / 4)  # not equal weights
    assert h200.metrics["kernel_launches"] == 4 and h200.metrics["roofline_pct"] == 25.0
    assert h200.metrics["launch_overhead_pct"] == pytest.approx(100 * (1 - 0.08224 / 0.1))
    clamp = next(k for k in h200.kernels if "clamp" in k.name)
    assert (clamp.compute_pct, clamp.memory_pct) == (17.48, 40.87)
    assert {"sm_throughput_pct", "achieved_occupancy_pct"} <= set(h200.metrics)
    assert "memory_throughput_pct" in h200.shown and "memory_throughput_pct" not in h200.metrics


def test_launch_0_reads_as_the_file_says(h200_rows):
    launch_0 = [r for r in h200_rows if r["instance"] == "0"]
    only = distill.distil({}, launch_0)
    assert only.metrics["dram_throughput_pct"] == 37.44
    assert only.metrics["achieved_occupancy_pct"] == 70.04 and only.shown["theoretical_occupancy_pct"] == 100.0
    assert only.limiter == "registers and warps (16 blocks per SM)"  # Block Limit Registers = Warps = 16


def test_the_limiter_stalls_and_dram_bytes(h200):
    assert h200.limiter == "registers and shared memory (1 block per SM)"  # the sgemm, the longest kernel
    assert h200.stall_reasons == () and any("no stall reasons" in note for note in h200.notes)
    # DRAM bytes/s times duration, summed: the clamp alone moves 1.794e12 B/s * 9.696 us = 17.4 MB
    assert 60e6 < h200.dram_bytes < 90e6
    assert h200.metrics["dram_bytes_ratio"] == pytest.approx(h200.dram_bytes / 32e6)


def test_stall_reasons_asked_for_by_name_are_read_and_named_for_the_model():
    # ncu 2025.3.1 on an H200 with kforge's command (tasks/ncu.py, STALL_METRICS included) around a
    # relu kernel and torch.relu: the stall ratios come back in "Command line profiler metrics"
    rows, _ = parse_details((REPORT.parent / "ncu_details_h200_stalls.csv").read_text(), 20)
    rows = [{**r, "tool": "ncu", "tool_version": "2025.3.1.0"} for r in rows]
    distilled = distill.distil({"runtime_ms": 0.05}, rows, min_bytes=32e6)

    names = [name for name, _ in distilled.stall_reasons]
    assert names[0] == "long_scoreboard"  # an elementwise kernel waits on global memory
    assert len(names) == 3 and all("smsp__" not in n and "ratio" not in n for n in names)
    assert "selected" not in names  # the issuing warp, 1.0 per instruction: no stall
    values = [value for _, value in distilled.stall_reasons]
    assert values == sorted(values, reverse=True) and values[0] > 5
    text = distill.summary_text(distilled)
    assert "top stall reasons (warps stalled per issued instruction): long_scoreboard" in text
    assert not any("no stall reasons" in note for note in distilled.notes)


def test_the_summary_is_a_few_lines_naming_what_matters(h200):
    text = distill.summary_text(h200)
    assert len(text.splitlines()) < 20
    assert "ncu 2025.3.1.0: 4 launches" in text and "DRAM throughput, % of peak: " in text
    assert "occupancy limiter of the longest kernel: registers and shared memory" in text
    assert "Note: no stall reasons" in text and "MB the problem must move" in text
    assert "60.7% 49.89 us cutlass::Kernel2" in text


def test_a_unit_the_metrics_file_does_not_list_is_left_out_with_a_note():
    rows = [
        {"tool": "ncu", "instance": "0", "metric": "Duration", "value": 5.0, "unit": "fortnight"},
        {"tool": "ncu", "instance": "0", "metric": "DRAM Throughput", "value": 80.0, "unit": "%"},
    ]
    distilled = distill.distil({"runtime_ms": 1.0}, rows)
    assert distilled.kernels[0].duration_us is None and "launch_overhead_pct" not in distilled.metrics
    assert any("'fortnight'" in note for note in distilled.notes)


def test_torch_profiler_rows_give_counts_and_time_shares_but_no_counters():
    rows = [
        {"tool": "torch.profiler", "section": section, "kernel": name, "metric": metric, "value": value}
        for section, name, metric, value in (
            ("cuda_kernels", "relu_kernel", "self_time_us", 300.0),
            ("cuda_kernels", "relu_kernel", "calls", 2.0),
            ("cuda_kernels", "copy_kernel", "self_time_us", 100.0),
            ("cuda_kernels", "copy_kernel", "calls", 1.0),
            ("cpu_ops", "aten::relu", "calls", 5.0),
        )
    ]
    distilled = distill.distil({"runtime_ms": 1.0}, rows)
    assert distilled.metrics == {
        "runtime_ms": 1.0,
        "cpu_op_calls": 5.0,
        "kernel_launches": 3.0,
        "launch_overhead_pct": 60.0,
    }
    assert [(k.name, k.launches, k.share) for k in distilled.kernels] == [
        ("relu_kernel", 2, 0.75),
        ("copy_kernel", 1, 0.25),
    ]
    assert distilled.limiter is None and any("no throughput" in note for note in distilled.notes)
    assert "75% 300 us relu_kernel (2 launches)" in distill.summary_text(distilled)
    assert knowledge.extract_state(distilled.metrics, knowledge.load(knowledge.SEED_PATH))[0] is None


def test_the_chart_is_a_png_with_one_bar_row_per_kernel(h200, tmp_path):
    path = distill.render_png(h200, tmp_path / "profile.png")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    height, width, channels = matplotlib.image.imread(io.BytesIO(data)).shape
    assert width == 1100 and height > 300 and channels in (3, 4)
    assert distill.png_bytes(h200) == data  # the same profile, the same bytes (reply cache keys hold)


def test_without_matplotlib_the_chart_error_says_what_to_install(h200, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match=r"pip install 'kforge\[report\]'"):
        distill.png_bytes(h200)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"ncu": {}, "torch": {}, "summary": {}}),
        REPORT.with_name("missing.json"),
    ],
)
def test_a_broken_metrics_file_is_one_line_naming_it(tmp_path, text):
    path = tmp_path / "profile_metrics.json"
    if isinstance(text, str):
        path.write_text(text)
    else:
        path = text
    with pytest.raises(distill.MetricsFileError) as caught:
        distill.load_spec(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message


def test_the_shipped_metrics_file_keeps_the_seed_rules_names():
    spec = distill.load_spec()
    rule_names = {m.name for m in spec.ncu.metrics if m.rules}
    assert {"dram_throughput_pct", "sm_throughput_pct", "achieved_occupancy_pct"} <= rule_names
