"""The profile stage: torch.profiler in a real isolated worker on the smoke ReLU problem, ncu's CSV
report parsed from a checked-in sample, and the rows through the `profiles` results table.

tests/data/ncu_details_sample.csv is hand-written: it imitates the output of `ncu --csv --page
details --log-file FILE` (Nsight Compute 2023-2024): ncu's own `==PROF==`
lines, then one quoted CSV line per (kernel launch, metric) with the columns "ID", "Process ID",
"Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size",
"Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value".
tests/data/ncu_details_h200.csv was captured: Nsight Compute 2025.3.1.0 on an NVIDIA H200 (driver
580, CUDA 13, torch 2.11), kforge's own command line (`tasks.ncu.command(ncu, FILE, 10)`: the six
sections, --clock-control none, --profile-from-start off) around a Python program that runs
torch.relu, torch.softmax and a 1024x4096 @ 4096x256 matmul between cudaProfilerStart and Stop
(.devrun-style scratch script, not in the repository); 2025.3 adds rule columns after "Metric Value".
"""

from pathlib import Path

import pytest

from kforge import results
from tasks import ncu, profile
from tasks.isolate import PROJECT_ROOT

PROBLEM_SOURCE = (PROJECT_ROOT / "data/problems/smoke/1_relu.py").read_text()
CANDIDATE_SOURCE = (PROJECT_ROOT / "kernels_ref/cpu/1_relu.py").read_text()
DATA = Path(__file__).resolve().parents[1] / "data"
SHAPES = "[[16, 16384]"  # the smoke problem's input first, as torch.profiler records an op's arguments


def by_name(profiled: dict) -> dict[str, dict]:
    return {row["name"]: row for row in profiled["rows"] if row["section"] == "cpu_ops"}


def test_candidate_profile_names_its_forward_and_ops(config):
    profiled = profile.profile_in_worker(PROBLEM_SOURCE, CANDIDATE_SOURCE, config)
    assert profiled["outcome"] == "correct", profiled
    assert profiled["tool"] == "torch.profiler" and profiled["truncated"] is False
    ops = by_name(profiled)
    # The g++ kernel runs through ctypes, inside the forward's own row: its self time holds the kernel's.
    assert ops["ModelNew.forward"]["self_time_us"] > 0 and ops["ModelNew.forward"]["calls"] == 1
    assert ops["aten::empty_like"]["input_shapes"].startswith(SHAPES) and ops["aten::empty_like"]["self_time_us"] > 0
    assert "aten::relu" not in ops  # the candidate's model was profiled, not the reference


def test_reference_profile_has_aten_relu(config):
    profiled = profile.profile_in_worker(PROBLEM_SOURCE, None, config, model="reference")
    assert profiled["outcome"] == "correct", profiled
    ops = by_name(profiled)
    assert ops["aten::relu"]["self_time_us"] > 0 and ops["aten::relu"]["calls"] == 1
    assert ops["aten::relu"]["input_shapes"].startswith(SHAPES)
    assert ops["Model.forward"]["total_time_us"] >= ops["aten::relu"]["total_time_us"]


def test_rows_land_in_the_profiles_table(config, tmp_path):
    profiled = profile.profile_in_worker(PROBLEM_SOURCE, CANDIDATE_SOURCE, config)
    written = profile.record_profile_task.fn(profiled, "r1", "1_relu", "a1", str(tmp_path))  # through append_rows
    assert written == 3 * len(profiled["rows"])
    loaded = results.load("profiles", tmp_path)
    assert len(loaded) == written and set(loaded["attempt_id"]) == {"a1"}
    assert set(loaded["metric"]) == {"self_time_us", "total_time_us", "calls"}
    forward = loaded[(loaded["kernel"] == "ModelNew.forward") & (loaded["metric"] == "self_time_us")]
    assert len(forward) == 1 and forward["value"].iloc[0] > 0 and forward["unit"].iloc[0] == "us"
    assert set(loaded["tool"]) == {"torch.profiler"} and loaded["schema_version"].iloc[0] == results.SCHEMA_VERSION


def test_candidate_that_crashes_in_forward_is_a_failure_result(config, tmp_path):
    crashing = CANDIDATE_SOURCE.replace("x = x.contiguous()", "raise RuntimeError('kernel exploded')")
    profiled = profile.profile_in_worker(PROBLEM_SOURCE, crashing, config)
    assert profiled["outcome"] == "runtime_error"
    assert profiled["error_class"] == "RuntimeError in forward" and "kernel exploded" in profiled["error_excerpt"]
    assert profile.record_profile_task.fn(profiled, "r1", "1_relu", "a1", str(tmp_path)) == 0
    assert results.load("profiles", tmp_path).empty


def test_refused_ncu_is_one_warning_and_the_torch_profiler(config, monkeypatch, caplog):
    # On the cpu backend ncu is never looked for; here a stand-in that refuses the counters is "found".
    monkeypatch.setattr(profile.ncu, "find_ncu", lambda backend: str(DATA / "fake_ncu_refused.sh"))
    profiled = profile.profile_in_worker(PROBLEM_SOURCE, CANDIDATE_SOURCE, config)
    assert profiled["outcome"] == "correct" and profiled["tool"] == "torch.profiler"
    assert "ncu" in profiled["warning"] and "\n" not in profiled["warning"]
    assert [r.message for r in caplog.records if "torch.profiler instead" in r.message] != []


def test_report_of_ncu_wrapping_the_worker_is_the_profile(config, monkeypatch):
    # A stand-in for ncu (the cpu backend has nothing for it) writes the checked-in sample as its report.
    monkeypatch.setattr(profile.ncu, "find_ncu", lambda backend: str(DATA / "fake_ncu_sample.sh"))
    monkeypatch.setattr(profile.ncu, "version", lambda path: "2024.1.1.0")
    profiled = profile.profile_in_worker(PROBLEM_SOURCE, CANDIDATE_SOURCE, config)
    assert profiled["outcome"] == "correct" and "warning" not in profiled, profiled
    assert (profiled["tool"], profiled["tool_version"], len(profiled["rows"])) == ("ncu", "2024.1.1.0", 9)


def test_ncu_is_not_looked_for_off_nvidia_or_off_path(monkeypatch):
    assert ncu.find_ncu("cpu") is None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert ncu.find_ncu("cuda") is None


def test_ncu_details_csv_parses_numeric_metrics_per_launch():
    report = (DATA / "ncu_details_sample.csv").read_text()
    assert ncu.refusal(report) is None
    rows, truncated = ncu.parse_details(report, max_launches=20)
    assert not truncated and {row["instance"] for row in rows} == {"0", "1"}
    assert len(rows) == 9  # 11 metric lines less a text value and an n/a
    threads = next(row for row in rows if row["metric"] == "Threads")
    assert threads["value"] == 4_194_304 and threads["section"] == "Launch Statistics"
    assert threads["kernel"].startswith("void at::native::vectorized_elementwise_kernel<4,")  # commas inside quotes
    memory = next(row for row in rows if row["section"] == "Memory Workload Analysis")
    assert memory["kernel"] == "relu_kernel(const float *, float *, long)"
    assert (memory["value"], memory["unit"]) == (3412.55, "Gbyte/second")


def test_ncu_details_csv_keeps_the_first_launches_and_says_so():
    rows, truncated = ncu.parse_details((DATA / "ncu_details_sample.csv").read_text(), max_launches=1)
    assert truncated and {row["instance"] for row in rows} == {"0"} and len(rows) == 4


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission ...\n", "NVreg_RestrictProfilingToAdminUsers"),
        ("==PROF== Connected\n==ERROR== Failed to connect to process 4242.\n", "ncu failed: Failed to connect"),
    ],
)
def test_ncu_refusal_is_one_line(report, reason):
    found = ncu.refusal(report)
    assert reason in found and "\n" not in found


def test_ncu_without_a_report_has_no_rows_and_no_refusal():
    for report in ("==WARNING== No kernels were profiled.\n", ""):
        assert ncu.refusal(report) is None and ncu.parse_details(report, max_launches=20) == ([], False)


def test_ncu_rows_become_profiles_rows():
    rows, _ = ncu.parse_details((DATA / "ncu_details_sample.csv").read_text(), max_launches=20)
    profiled = {"outcome": "correct", "tool": "ncu", "tool_version": "2024.1.1.0", "rows": rows}
    table_rows = profile.profile_rows(profiled, run_id="r1", problem_id="1_relu", attempt_id=None)
    assert len(table_rows) == len(rows) and table_rows[0]["tool"] == "ncu" and table_rows[0]["attempt_id"] is None
    results._to_arrow("profiles", table_rows, "r1")  # every row fits the schema


def test_ncu_command_profiles_only_the_marked_call():
    argv = ncu.command("/usr/bin/ncu", Path("/ctl/report.csv"), 20)
    joined = " ".join(argv)
    for section in ncu.SECTIONS:
        assert f"--section {section}" in joined
    assert "--profile-from-start off" in joined and "--launch-count 20" in joined and "--clock-control none" in joined
    assert argv[-2:] == ["--log-file", "/ctl/report.csv"] and "--target-processes application-only" in joined


def test_ncu_report_captured_on_an_h200_parses_per_launch():
    report = (DATA / "ncu_details_h200.csv").read_text()
    assert ncu.refusal(report) is None
    rows, truncated = ncu.parse_details(report, max_launches=20)
    kernels = {row["instance"]: row["kernel"] for row in rows}
    assert not truncated and sorted(kernels) == ["0", "1", "2", "3"]
    assert "elementwise" in kernels["0"] and "SoftMax" in kernels["1"] and "sgemm" in kernels["2"]
    by = {(row["instance"], row["section"], row["metric"]): row for row in rows}
    duration = by[("0", "GPU Speed Of Light Throughput", "Duration")]
    assert (duration["value"], duration["unit"]) == (9696.0, "ns")
    assert by[("0", "GPU Speed Of Light Throughput", "DRAM Throughput")]["value"] == 37.44
    assert by[("0", "Occupancy", "Achieved Occupancy")]["value"] == 70.04
    assert len(rows) == 228  # 57 numeric metrics per launch; rule lines and text values are not metrics
    # only the first launches when capped
    capped, truncated = ncu.parse_details(report, max_launches=2)
    assert truncated and {row["instance"] for row in capped} == {"0", "1"}


def test_ncu_that_times_out_is_given_up_for_the_rest_of_the_run(config, monkeypatch):
    monkeypatch.setattr(profile, "_ncu_given_up", {})
    monkeypatch.setattr(profile.ncu, "find_ncu", lambda backend: str(DATA / "fake_ncu_hangs.sh"))
    quick = config.model_copy(update={"profile_timeout_s": 2.0})
    first = profile.profile_in_worker(PROBLEM_SOURCE, CANDIDATE_SOURCE, quick)
    assert first["outcome"] == "correct" and first["tool"] == "torch.profiler"
    assert "timeout" in first["warning"] and "earlier in this run" not in first["warning"]
    assert first["warning"].endswith("ncu wrote nothing")  # how far ncu got, for a diagnosis
    second = profile.profile_in_worker(PROBLEM_SOURCE, CANDIDATE_SOURCE, quick)
    assert second["tool"] == "torch.profiler" and second["warning"].endswith("(earlier in this run)")
    profile.forget_ncu_failures()  # what run_suite does when the next run starts
    third = profile.profile_in_worker(PROBLEM_SOURCE, CANDIDATE_SOURCE, quick)
    assert "timeout" in third["warning"] and "earlier in this run" not in third["warning"]
