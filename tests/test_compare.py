"""Tests for kforge.compare (regression detection between two runs) and the `kforge compare` command,
on result tables written with kforge.results.append_rows, so the real schema and loader are used."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kforge.cli import app
from kforge.compare import CompareError, ProblemResult, classify, compare_runs, comparison_markdown
from kforge.results import append_rows

REPO_ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2025, 3, 14, 12, 0, tzinfo=timezone.utc)


def write_run(
    results_dir: Path,
    run_id: str,
    attempts: list[dict],
    hours: float,
    status: str = "finished",
    backend: str = "triton",
    model: str = "gpt-x",
    suite: str = "smoke",
) -> None:
    """One run, as the suite flow records it: a 'running' row, the attempts, then the final row."""
    started = T0 + timedelta(hours=hours)
    config = {"suite": f"data/problems/{suite}", "backend": backend, "llm": {"model": model}}
    common = {"config": config, "started_at": started, "git_sha": "abc"}
    append_rows(results_dir, "runs", [{**common, "status": "running"}], run_id=run_id, run_date=started.date())
    rows = []
    for index, attempt in enumerate(attempts):
        row = {
            "attempt_id": f"{run_id}-{index}",
            "suite": suite,
            "backend": backend,
            "model": model,
            "level": 1,
            "created_at": started + timedelta(minutes=index + 1),
            **attempt,
        }
        rows.append(row)
    if rows:
        append_rows(results_dir, "attempts", rows, run_id=run_id, run_date=started.date())
    final = {**common, "status": status, "finished_at": started + timedelta(hours=1)}
    append_rows(results_dir, "runs", [final], run_id=run_id, run_date=date(2025, 3, 14))


def correct(problem_id: str, speedup: float, runtime_ms: float, p10: float, p90: float) -> dict:
    return {
        "problem_id": problem_id,
        "outcome": "correct",
        "speedup_best": speedup,
        "speedup_eager": speedup,
        "runtime_ms": runtime_ms,
        "runtime_p10_ms": p10,
        "runtime_p90_ms": p90,
        "eager_ms": speedup * runtime_ms,
    }


def failing(problem_id: str, outcome: str) -> dict:
    return {"problem_id": problem_id, "outcome": outcome, "error_class": "x"}


# Run A and run B of one suite (baseline 2.0 ms for every problem, so speedup = 2.0 / runtime).
#   p_slow:  1.00 ms [0.95, 1.05]  -> 1.60 ms [1.50, 1.70]   B's p10 1.50 > A's p90 1.05: regression
#   p_noise: 1.00 ms [0.80, 1.30]  -> 1.10 ms [0.90, 1.40]   slower median but overlapping: within noise
#   p_break: correct 2.0x          -> numerical_mismatch      new failure
#   p_fixed: compile_error         -> correct                 improvement (fixed)
#   p_fast:  2.00 ms [1.90, 2.10]  -> 1.00 ms [0.95, 1.05]   improvement beyond noise
RUN_A = [
    correct("p_slow", 2.0, 1.0, 0.95, 1.05),
    correct("p_noise", 2.0, 1.0, 0.8, 1.3),
    correct("p_break", 2.0, 1.0, 0.95, 1.05),
    failing("p_fixed", "compile_error"),
    correct("p_fast", 1.0, 2.0, 1.9, 2.1),
]
RUN_B = [
    correct("p_slow", 1.25, 1.6, 1.5, 1.7),
    correct("p_noise", 2.0 / 1.1, 1.1, 0.9, 1.4),
    # No correct attempt at p_break in B: the last attempt's outcome counts.
    failing("p_break", "runtime_error"),
    failing("p_break", "numerical_mismatch"),
    correct("p_fixed", 1.0, 2.0, 1.9, 2.1),
    correct("p_fast", 2.0, 1.0, 0.95, 1.05),
]


@pytest.fixture
def two_runs(tmp_path) -> Path:
    write_run(tmp_path, "run-a", RUN_A, hours=0)
    write_run(tmp_path, "run-b", RUN_B, hours=2)
    return tmp_path


def changes(result) -> dict[str, str]:
    return {p.problem_id: p.change for p in result.problems}


def test_classes_of_every_problem(two_runs):
    result = compare_runs(two_runs)
    assert (result.run_a.run_id, result.run_b.run_id) == ("run-a", "run-b")
    assert changes(result) == {
        "p_slow": "slower",
        "p_noise": "within_noise",
        "p_break": "new_failure",
        "p_fixed": "fixed",
        "p_fast": "faster",
    }
    assert [p.problem_id for p in result.regressions] == ["p_break", "p_slow"]
    assert [p.problem_id for p in result.within_noise] == ["p_noise"]
    assert sorted(p.problem_id for p in result.improvements) == ["p_fast", "p_fixed"]
    # p_break's last attempt decides its outcome (it had no correct attempt in B).
    assert result.new_failures_by_outcome == {"numerical_mismatch": 1}
    assert result.has_regressions and result.exit_code == 1


def test_regression_beyond_noise_exits_1_through_the_command(two_runs):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "kforge.cli", "compare", "--results", str(two_runs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    slow = next(line for line in lines if "p_slow" in line)
    assert slow.split()[0] == "slower" and "2.00x" in slow and "1.25x" in slow
    noise = next(line for line in lines if "p_noise" in line)
    assert noise.startswith("within noise")
    assert "numerical_mismatch 1" in done.stdout
    assert lines[-1] == "REGRESSED"


def test_drop_within_noise_alone_is_not_a_regression(tmp_path):
    # 1.00 ms [0.90, 1.20] -> 1.10 ms [1.00, 1.30]: 9 % slower, but B's p10 (1.00) is below A's p90 (1.20).
    write_run(tmp_path, "a", [correct("p1", 2.0, 1.0, 0.9, 1.2)], hours=0)
    write_run(tmp_path, "b", [correct("p1", 2.0 / 1.1, 1.1, 1.0, 1.3)], hours=1)
    result = compare_runs(tmp_path)
    assert changes(result) == {"p1": "within_noise"}
    assert result.regressions == [] and result.exit_code == 0
    done = CliRunner().invoke(app, ["compare", "--results", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert "within noise" in done.output and done.output.splitlines()[-1] == "no regressions"


def test_the_same_drop_with_tight_noise_is_a_regression(tmp_path):
    # The same 9 % drop as above, measured with a tight spread: intervals apart, so it is flagged.
    write_run(tmp_path, "a", [correct("p1", 2.0, 1.0, 0.99, 1.01)], hours=0)
    write_run(tmp_path, "b", [correct("p1", 2.0 / 1.1, 1.1, 1.09, 1.11)], hours=1)
    assert changes(compare_runs(tmp_path)) == {"p1": "slower"}
    assert CliRunner().invoke(app, ["compare", "--results", str(tmp_path)]).exit_code == 1


def test_a_changed_baseline_is_judged_on_the_speedup_interval(tmp_path):
    # Same kernel time and spread, but the speedup fell from 2.0 to 1.0 (the baseline got faster):
    # speedup intervals [1.90, 2.11] and [0.95, 1.05] do not overlap.
    write_run(tmp_path, "a", [correct("p1", 2.0, 1.0, 0.95, 1.05)], hours=0)
    write_run(tmp_path, "b", [correct("p1", 1.0, 1.0, 0.95, 1.05)], hours=1)
    assert changes(compare_runs(tmp_path)) == {"p1": "slower"}


def test_new_failure_is_counted_by_outcome_class(tmp_path):
    a = [correct(f"p{i}", 2.0, 1.0, 0.95, 1.05) for i in range(4)]
    b = [
        failing("p0", "numerical_mismatch"),
        failing("p1", "numerical_mismatch"),
        failing("p2", "timeout"),
        correct("p3", 2.0, 1.0, 0.95, 1.05),
    ]
    write_run(tmp_path, "a", a, hours=0)
    write_run(tmp_path, "b", b, hours=1)
    result = compare_runs(tmp_path)
    assert [p.problem_id for p in result.new_failures] == ["p0", "p1", "p2"]
    assert result.new_failures_by_outcome == {"numerical_mismatch": 2, "timeout": 1}
    assert changes(result)["p3"] == "unchanged"
    done = CliRunner().invoke(app, ["compare", "--results", str(tmp_path)])
    assert done.exit_code == 1
    assert "numerical_mismatch 2, timeout 1" in done.output


def test_improvements_alone_exit_0(tmp_path):
    write_run(tmp_path, "a", [failing("p1", "compile_error"), correct("p2", 1.0, 2.0, 1.9, 2.1)], hours=0)
    write_run(tmp_path, "b", [correct("p1", 1.5, 1.0, 0.9, 1.1), correct("p2", 2.0, 1.0, 0.95, 1.05)], hours=1)
    result = compare_runs(tmp_path)
    assert changes(result) == {"p1": "fixed", "p2": "faster"}
    assert result.regressions == [] and result.exit_code == 0
    assert CliRunner().invoke(app, ["compare", "--results", str(tmp_path)]).exit_code == 0


def test_best_attempt_is_the_fastest_correct_one(tmp_path):
    # A's best for p1 is its 2.0x attempt (not the later 1.0x one, nor the failure after it).
    a = [correct("p1", 2.0, 1.0, 0.95, 1.05), correct("p1", 1.0, 2.0, 1.9, 2.1), failing("p1", "timeout")]
    write_run(tmp_path, "a", a, hours=0)
    write_run(tmp_path, "b", [correct("p1", 1.0, 2.0, 1.9, 2.1)], hours=1)
    result = compare_runs(tmp_path)
    assert result.problems[0].a.speedup == 2.0
    assert changes(result) == {"p1": "slower"}


def test_default_pairs_the_latest_with_the_previous_run_of_the_same_configuration(tmp_path):
    write_run(tmp_path, "old-triton", [correct("p1", 2.0, 1.0, 0.95, 1.05)], hours=0)
    # Between them: a run of another backend (faster still, so pairing with it would change the verdict),
    # one of another model, and a failed run of the same configuration.
    write_run(tmp_path, "mid-cuda", [correct("p1", 4.0, 0.5, 0.45, 0.55)], hours=1, backend="cuda")
    write_run(tmp_path, "mid-model", [correct("p1", 4.0, 0.5, 0.45, 0.55)], hours=2, model="other")
    write_run(tmp_path, "mid-failed", [failing("p1", "timeout")], hours=3, status="failed")
    write_run(tmp_path, "new-triton", [correct("p1", 2.0, 1.0, 0.95, 1.05)], hours=4)
    result = compare_runs(tmp_path)
    assert (result.run_a.run_id, result.run_b.run_id) == ("old-triton", "new-triton")
    assert result.run_b.identity == ("smoke", "triton", "gpt-x")
    assert changes(result) == {"p1": "unchanged"}


def test_one_run_id_is_checked_against_its_previous_run(tmp_path):
    write_run(tmp_path, "cuda-1", [correct("p1", 2.0, 1.0, 0.95, 1.05)], hours=0, backend="cuda")
    write_run(tmp_path, "triton-1", [correct("p1", 2.0, 1.0, 0.95, 1.05)], hours=1)
    write_run(tmp_path, "cuda-2", [correct("p1", 1.0, 2.0, 1.9, 2.1)], hours=2, backend="cuda")
    write_run(tmp_path, "triton-2", [correct("p1", 2.0, 1.0, 0.95, 1.05)], hours=3)
    assert compare_runs(tmp_path).run_a.run_id == "triton-1"
    result = compare_runs(tmp_path, run_b="cuda-2")
    assert result.run_a.run_id == "cuda-1" and changes(result) == {"p1": "slower"}
    done = CliRunner().invoke(app, ["compare", "cuda-2", "--results", str(tmp_path)])
    assert done.exit_code == 1 and "A cuda-1 -> B cuda-2" in done.output
    # Two explicit ids are compared as given, even across backends (with a note).
    done = CliRunner().invoke(app, ["compare", "triton-2", "cuda-2", "--results", str(tmp_path)])
    assert done.exit_code == 1 and "differ in backend (triton vs cuda)" in done.output


def test_unknown_run_id_is_one_line_naming_the_directory_and_exit_2(two_runs):
    done = CliRunner().invoke(app, ["compare", "run-a", "no-such-run", "--results", str(two_runs)])
    assert done.exit_code == 2
    assert done.stdout == ""
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1
    assert "no-such-run" in message and str(two_runs) in message and "--by run_id" in message
    with pytest.raises(CompareError, match="unknown run id 'nope'"):
        compare_runs(two_runs, run_a="nope", run_b="run-b")


def test_no_previous_run_and_no_results_are_usage_errors(tmp_path):
    empty = CliRunner().invoke(app, ["compare", "--results", str(tmp_path / "nothing")])
    assert empty.exit_code == 2 and len(empty.stderr.strip().splitlines()) == 1
    write_run(tmp_path, "only", [correct("p1", 2.0, 1.0, 0.95, 1.05)], hours=0)
    done = CliRunner().invoke(app, ["compare", "--results", str(tmp_path)])
    assert done.exit_code == 2
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1
    assert "no finished run before only" in message and "kforge compare RUN_A RUN_B" in message


def test_markdown_names_the_regression_and_both_speedups(two_runs):
    markdown = comparison_markdown(compare_runs(two_runs))
    assert markdown.startswith("### kforge compare: regressed")
    row = next(line for line in markdown.splitlines() if "p_slow" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:3] == ["slower", "p_slow", "2.00x"] and cells[4] == "1.25x"
    assert cells[3] == "1.90-2.11" and cells[5] == "1.18-1.33"  # the two noise intervals
    assert "| new failure | p_break | 2.00x |" in markdown and "numerical_mismatch" in markdown
    header = markdown.splitlines().index("| change | problem | A | A noise | B | B noise |")
    assert markdown.splitlines()[header + 1] == "|---|---|---|---|---|---|"


def test_missing_noise_data_is_listed_but_not_flagged():
    a = ProblemResult("correct", 2.0, 1.0, None, None)
    b = ProblemResult("correct", 1.0, 2.0, 1.9, 2.1)
    assert classify(a, b) == "unmeasured"
    assert classify(b, None) == "only_a" and classify(None, b) == "only_b"
    assert classify(ProblemResult("timeout", None, None, None, None), ProblemResult("compile_error", *[None] * 4)) == (
        "still_failing"
    )
