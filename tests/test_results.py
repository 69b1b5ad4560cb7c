"""Tests for kforge.results: schemas, atomic append-only writes, loading and the fast_p metrics."""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kforge import results
from kforge.results import (
    ATTEMPTS_SCHEMA,
    KB_UPDATES_SCHEMA,
    PROFILES_SCHEMA,
    RUNS_SCHEMA,
    SCHEMA_VERSION,
    ResultsWriteError,
    append_rows,
    best_per_problem,
    fast_p,
    geomean_speedup,
    load,
    report_table,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_DATE = date(2025, 3, 14)
T0 = datetime(2025, 3, 14, 12, 0, 0, tzinfo=timezone.utc)


def attempt_row(**overrides) -> dict:
    row = {
        "attempt_id": "a1",
        "problem_id": "L1/relu",
        "problem_hash": "ph1",
        "level": 1,
        "suite": "kernelbench",
        "backend": "triton",
        "device": "cuda",
        "size_preset": None,
        "model": "gpt-x",
        "agent": "one_shot",
        "agent_config": {"temperature": 0.2},
        "iteration": 0,
        "rollout": 3,
        "parent_attempt": None,
        "outcome": "correct",
        "error_class": None,
        "error_excerpt": None,
        "source_hash": "sh1",
        "candidate_source": "def kernel(): ...",
        "compile_s": 1.5,
        "runtime_ms": 0.25,
        "runtime_p10_ms": 0.2,
        "runtime_p90_ms": 0.3,
        "eager_ms": 0.5,
        "compile_ms": 0.4,
        "speedup_eager": 2.0,
        "speedup_compile": 1.6,
        "speedup_best": 1.6,
        "atol": 1e-4,
        "rtol": 1e-3,
        "allow_library_calls": False,
        "tokens_in": 1200,
        "tokens_out": 800,
        "cost_usd": 0.012,
        "created_at": T0,
    }
    return {**row, **overrides}


def run_row(**overrides) -> dict:
    row = {
        "status": "running",
        "git_sha": "abc123",
        "config": {"model": "gpt-x"},
        "host": "box",
        "device": "cuda",
        "gpu_name": "H100",
        "driver": "550.1",
        "toolchain": {"nvcc": "12.4"},
        "torch_version": "2.4.0",
        "python_version": "3.11.9",
        "started_at": T0,
        "finished_at": None,
        "summary": None,
    }
    return {**row, **overrides}


def visible_files(results_dir: Path) -> list[Path]:
    return sorted(p for p in results_dir.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))


# --- schemas and round trips -------------------------------------------------------------------------


def test_schemas_carry_version_metadata():
    assert results.SCHEMAS == {
        "attempts": ATTEMPTS_SCHEMA,
        "runs": RUNS_SCHEMA,
        "profiles": PROFILES_SCHEMA,
        "kb_updates": KB_UPDATES_SCHEMA,
    }
    for schema in (ATTEMPTS_SCHEMA, RUNS_SCHEMA):
        assert schema.metadata[b"kforge.schema_version"] == str(SCHEMA_VERSION).encode()
    assert ATTEMPTS_SCHEMA.field("level").type == pa.int16()
    assert ATTEMPTS_SCHEMA.field("created_at").type == pa.timestamp("us", tz="UTC")
    assert RUNS_SCHEMA.field("finished_at").type == pa.timestamp("us", tz="UTC")
    assert "correct" in results.OUTCOMES and len(results.OUTCOMES) == 8


def test_attempts_round_trip_through_load_and_read_parquet(tmp_path):
    rows = [attempt_row(), attempt_row(attempt_id="a2", level=None, outcome="compile_error", runtime_ms=None)]
    path = append_rows(tmp_path, "attempts", rows, run_id="r1", run_date=RUN_DATE)

    assert path.parent == tmp_path / "attempts" / "date=2025-03-14"
    assert path.name.startswith("part-r1-") and path.suffix == ".parquet"
    # The file holds exactly the declared schema, version metadata included.
    assert pq.read_schema(path).equals(ATTEMPTS_SCHEMA, check_metadata=True)

    df = load("attempts", tmp_path)
    assert list(df.columns) == [*ATTEMPTS_SCHEMA.names, "date"]
    assert str(df["level"].dtype) == "Int16"
    assert str(df["iteration"].dtype) == "Int32"
    assert str(df["tokens_in"].dtype) == "Int64"
    assert str(df["allow_library_calls"].dtype) == "boolean"
    assert str(df["created_at"].dtype) == "datetime64[us, UTC]"
    assert df["runtime_ms"].dtype == np.float64
    assert pd.api.types.is_string_dtype(df["problem_id"])
    first, second = df.set_index("attempt_id").loc["a1"], df.set_index("attempt_id").loc["a2"]
    assert first["run_id"] == "r1" and first["schema_version"] == SCHEMA_VERSION
    assert first["level"] == 1 and pd.isna(second["level"])
    assert first["speedup_eager"] == 2.0 and pd.isna(second["runtime_ms"])
    assert pd.isna(first["size_preset"])
    assert first["agent_config"] == '{"temperature": 0.2}'
    assert first["created_at"] == pd.Timestamp(T0)
    assert first["date"] == "2025-03-14"

    plain = pd.read_parquet(tmp_path / "attempts")
    assert sorted(plain.columns) == sorted([*ATTEMPTS_SCHEMA.names, "date"])
    assert sorted(plain["attempt_id"]) == ["a1", "a2"]
    assert str(plain["created_at"].dtype) == "datetime64[us, UTC]"
    dataset_schema = pq.read_table(tmp_path / "attempts").schema
    assert dataset_schema.metadata[b"kforge.schema_version"] == str(SCHEMA_VERSION).encode()
    for field in ATTEMPTS_SCHEMA:
        assert dataset_schema.field(field.name).type == field.type


def test_runs_round_trip_through_load_and_read_parquet(tmp_path):
    path = append_rows(tmp_path, "runs", [run_row()], run_id="r1", run_date=RUN_DATE)
    assert pq.read_schema(path).equals(RUNS_SCHEMA, check_metadata=True)

    df = load("runs", tmp_path)
    assert list(df.columns) == [*RUNS_SCHEMA.names, "date"]
    assert df.loc[0, "run_id"] == "r1" and df.loc[0, "toolchain"] == '{"nvcc": "12.4"}'
    assert str(df["started_at"].dtype) == "datetime64[us, UTC]"
    assert pd.isna(df.loc[0, "finished_at"])

    plain = pd.read_parquet(tmp_path / "runs")
    assert sorted(plain.columns) == sorted([*RUNS_SCHEMA.names, "date"])
    assert pq.read_table(tmp_path / "runs").schema.metadata[b"kforge.schema_version"] == str(SCHEMA_VERSION).encode()


def test_load_of_absent_table_is_empty_with_schema_columns(tmp_path):
    for table, schema in results.SCHEMAS.items():
        df = load(table, tmp_path / "nothing_here")
        assert df.empty
        assert list(df.columns) == [*schema.names, "date"]


# --- appending ---------------------------------------------------------------------------------------


def test_second_append_adds_a_file_and_leaves_the_first_untouched(tmp_path):
    first = append_rows(tmp_path, "attempts", [attempt_row()], run_id="r1", run_date=RUN_DATE)
    first_bytes = first.read_bytes()
    second = append_rows(tmp_path, "attempts", [attempt_row(attempt_id="a2")], run_id="r1", run_date=RUN_DATE)

    assert second != first
    assert first.read_bytes() == first_bytes
    assert visible_files(tmp_path) == sorted([first, second])
    assert sorted(load("attempts", tmp_path)["attempt_id"]) == ["a1", "a2"]
    assert sorted(pd.read_parquet(tmp_path / "attempts")["attempt_id"]) == ["a1", "a2"]


def test_missing_columns_become_null_and_bookkeeping_is_filled(tmp_path):
    append_rows(tmp_path, "attempts", [{"attempt_id": "a1", "outcome": "timeout"}], run_id="r9")
    df = load("attempts", tmp_path)
    assert len(df) == 1
    assert df.loc[0, "run_id"] == "r9" and df.loc[0, "schema_version"] == SCHEMA_VERSION
    assert pd.isna(df.loc[0, "problem_id"]) and pd.isna(df.loc[0, "runtime_ms"])
    assert pd.notna(df.loc[0, "created_at"])


def test_unknown_column_is_rejected_and_named(tmp_path):
    with pytest.raises(ValueError, match="bogus_column"):
        append_rows(tmp_path, "attempts", [attempt_row(bogus_column=1)], run_id="r1")
    assert visible_files(tmp_path) == []


def test_bad_outcome_and_status_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="outcome"):
        append_rows(tmp_path, "attempts", [attempt_row(outcome="kinda_correct")], run_id="r1")
    with pytest.raises(ValueError, match="outcome"):
        append_rows(tmp_path, "attempts", [attempt_row(outcome=None)], run_id="r1")
    with pytest.raises(ValueError, match="status"):
        append_rows(tmp_path, "runs", [run_row(status="paused")], run_id="r1")
    assert visible_files(tmp_path) == []


def test_wrongly_typed_value_names_the_column(tmp_path):
    with pytest.raises(ValueError, match="tokens_in"):
        append_rows(tmp_path, "attempts", [attempt_row(tokens_in="many")], run_id="r1")


def test_unknown_table_and_empty_rows_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="table"):
        append_rows(tmp_path, "candidates", [{"x": 1}], run_id="r1")
    with pytest.raises(ValueError):
        append_rows(tmp_path, "attempts", [], run_id="r1")
    with pytest.raises(ValueError, match="run_id"):
        append_rows(tmp_path, "attempts", [attempt_row()], run_id="../escape")


# --- atomicity and write failures --------------------------------------------------------------------


def test_leftover_partial_dot_file_is_ignored_by_load_and_read_parquet(tmp_path):
    good = append_rows(tmp_path, "attempts", [attempt_row()], run_id="r1", run_date=RUN_DATE)
    # What a process killed mid-write leaves behind: a truncated file under a hidden name.
    partial = good.parent / ".part-r2-deadbeef.parquet.tmp"
    partial.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    hidden_parquet = good.parent / ".part-r3-deadbeef.parquet"
    hidden_parquet.write_bytes(b"PAR1 garbage")

    assert list(load("attempts", tmp_path)["attempt_id"]) == ["a1"]
    assert list(pd.read_parquet(tmp_path / "attempts")["attempt_id"]) == ["a1"]


def test_sigkill_mid_append_leaves_only_complete_files(tmp_path):
    rows_per_file = 40
    child_code = textwrap.dedent(
        f"""
        import itertools, os, sys
        from kforge.results import append_rows
        for batch in itertools.count():
            rows = [
                {{"attempt_id": f"a{{batch}}-{{i}}", "outcome": "correct", "candidate_source": os.urandom(20000).hex()}}
                for i in range({rows_per_file})
            ]
            append_rows(sys.argv[1], "attempts", rows, run_id="killed")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", child_code, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 60
        while len(visible_files(tmp_path)) < 5:
            assert child.poll() is None, "writer exited early"
            assert time.monotonic() < deadline, "writer produced no files in time"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL

    files = visible_files(tmp_path)
    assert len(files) >= 5
    for path in files:
        assert path.name.startswith("part-killed-") and path.suffix == ".parquet"
        assert pq.read_table(path).num_rows == rows_per_file
    df = load("attempts", tmp_path)
    assert len(df) == rows_per_file * len(files)
    assert len(pd.read_parquet(tmp_path / "attempts")) == rows_per_file * len(files)


def test_partition_path_that_is_a_file_raises_results_write_error(tmp_path):
    append_rows(tmp_path, "attempts", [attempt_row()], run_id="r1", run_date=RUN_DATE)
    blocked = tmp_path / "attempts" / "date=2025-03-15"
    blocked.write_text("not a directory")

    with pytest.raises(ResultsWriteError) as excinfo:
        append_rows(tmp_path, "attempts", [attempt_row(attempt_id="a2")], run_id="r1", run_date=date(2025, 3, 15))
    message = str(excinfo.value)
    assert "\n" not in message
    assert str(blocked) in message
    assert "exists" in message.lower() or "directory" in message.lower()
    assert list(load("attempts", tmp_path)["attempt_id"]) == ["a1"]


def test_disk_full_during_write_removes_temp_file(tmp_path, monkeypatch):
    append_rows(tmp_path, "attempts", [attempt_row()], run_id="r1", run_date=RUN_DATE)
    before = sorted(p.name for p in (tmp_path / "attempts" / "date=2025-03-14").iterdir())

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results.os, "fsync", no_space)
    with pytest.raises(ResultsWriteError, match="No space left on device") as excinfo:
        append_rows(tmp_path, "attempts", [attempt_row(attempt_id="a2")], run_id="r1", run_date=RUN_DATE)
    monkeypatch.undo()

    partition = tmp_path / "attempts" / "date=2025-03-14"
    assert str(partition) in str(excinfo.value)
    assert sorted(p.name for p in partition.iterdir()) == before  # no temp file, no new file
    assert list(load("attempts", tmp_path)["attempt_id"]) == ["a1"]


# --- runs dedup --------------------------------------------------------------------------------------


def test_runs_keep_the_final_row_per_run(tmp_path):
    finished_at = datetime(2025, 3, 14, 13, 0, tzinfo=timezone.utc)
    append_rows(tmp_path, "runs", [run_row()], run_id="r1", run_date=RUN_DATE)
    append_rows(
        tmp_path,
        "runs",
        [run_row(status="finished", finished_at=finished_at, summary={"correct": 3})],
        run_id="r1",
        run_date=RUN_DATE,
    )
    # r2's final row is written first: precedence, not file order, must decide.
    append_rows(tmp_path, "runs", [run_row(status="failed", finished_at=finished_at)], run_id="r2")
    append_rows(tmp_path, "runs", [run_row()], run_id="r2")
    # r3 is still running.
    append_rows(tmp_path, "runs", [run_row()], run_id="r3")

    runs = load("runs", tmp_path).set_index("run_id")
    assert sorted(runs.index) == ["r1", "r2", "r3"]
    assert runs.loc["r1", "status"] == "finished"
    assert runs.loc["r1", "finished_at"] == pd.Timestamp(finished_at)
    assert runs.loc["r1", "summary"] == '{"correct": 3}'
    assert runs.loc["r2", "status"] == "failed"
    assert runs.loc["r3", "status"] == "running"


# --- metrics -----------------------------------------------------------------------------------------


def metrics_frame() -> pd.DataFrame:
    """Five problems; speedup_eager / speedup_compile per attempt:

    level 1: p1 correct 2.0/1.0 and correct 0.5/0.25  -> best eager 2.0, best compile 1.0
             p2 correct 1.2/0.6                       -> best eager 1.2, best compile 0.6
             p3 compile_error (null) and numerical_mismatch 5.0/5.0 (wrong kernel, must not count)
    level 2: p4 correct 3.0/1.5                       -> best eager 3.0, best compile 1.5
             p5 runtime_error (null) and correct 0.75/0.375
    """
    rows = [
        ("p1", 1, "correct", 2.0, 1.0),
        ("p1", 1, "correct", 0.5, 0.25),
        ("p2", 1, "correct", 1.2, 0.6),
        ("p3", 1, "compile_error", None, None),
        ("p3", 1, "numerical_mismatch", 5.0, 5.0),
        ("p4", 2, "correct", 3.0, 1.5),
        ("p5", 2, "runtime_error", None, None),
        ("p5", 2, "correct", 0.75, 0.375),
    ]
    frame = pd.DataFrame(rows, columns=["problem_id", "level", "outcome", "speedup_eager", "speedup_compile"])
    frame["backend"] = "triton"
    return frame


def test_best_per_problem():
    best = best_per_problem(metrics_frame(), by=["level"]).set_index("problem_id")
    assert list(best.columns) == ["level", "correct", "speedup_eager"]
    assert best["correct"].to_dict() == {"p1": True, "p2": True, "p3": False, "p4": True, "p5": True}
    assert best.loc["p1", "speedup_eager"] == 2.0
    assert best.loc["p5", "speedup_eager"] == 0.75
    assert math.isnan(best.loc["p3", "speedup_eager"])  # the 5.0 was not a correct attempt

    compile_best = best_per_problem(metrics_frame(), by=[], baseline="compile").set_index("problem_id")
    assert compile_best.loc["p4", "speedup_compile"] == 1.5


def test_fast_p_overall():
    df = metrics_frame()
    # 5 problems. Correct: p1, p2, p4, p5 -> 4/5.
    assert fast_p(df, 0) == pytest.approx(0.8)
    # Best speedup > 1: p1 (2.0), p2 (1.2), p4 (3.0) -> 3/5; p5 (0.75) drops out.
    assert fast_p(df, 1) == pytest.approx(0.6)
    # > 1.5: p1 (2.0), p4 (3.0) -> 2/5; p2 (1.2) drops out.
    assert fast_p(df, 1.5) == pytest.approx(0.4)
    # > 2 is strict: p1's 2.0 does not count; only p4 -> 1/5.
    assert fast_p(df, 2) == pytest.approx(0.2)
    # Compile baseline, > 1: only p4 (1.5); p1's best is exactly 1.0 -> 1/5.
    assert fast_p(df, 1, baseline="compile") == pytest.approx(0.2)
    assert isinstance(fast_p(df, 1), float)


def test_fast_p_by_level():
    df = metrics_frame()
    # level 1: p1, p2, p3 -> correct 2/3; > 1: p1, p2 -> 2/3; > 1.5: p1 -> 1/3.
    # level 2: p4, p5     -> correct 2/2; > 1: p4 -> 1/2;    > 1.5: p4 -> 1/2.
    at_0 = fast_p(df, 0, by=["level"])
    at_1 = fast_p(df, 1, by=["level"])
    at_15 = fast_p(df, 1.5, by=["level"])
    assert isinstance(at_0, pd.Series)
    assert list(at_0.index) == [1, 2]
    assert at_0.to_dict() == pytest.approx({1: 2 / 3, 2: 1.0})
    assert at_1.to_dict() == pytest.approx({1: 2 / 3, 2: 0.5})
    assert at_15.to_dict() == pytest.approx({1: 1 / 3, 2: 0.5})


def test_geomean_speedup():
    df = metrics_frame()
    # Best correct speedups: p1 2.0, p2 1.2, p4 3.0, p5 0.75 (p3 has none).
    # (2.0 * 1.2 * 3.0 * 0.75)^(1/4) = 5.4^(1/4).
    assert geomean_speedup(df) == pytest.approx(5.4**0.25)
    # level 1: sqrt(2.0*1.2) = sqrt(2.4); level 2: sqrt(3.0*0.75) = sqrt(2.25) = 1.5.
    by_level = geomean_speedup(df, by=["level"])
    assert by_level.to_dict() == pytest.approx({1: math.sqrt(2.4), 2: 1.5})
    # Compile baseline: (1.0*0.6*1.5*0.375)^(1/4) = 0.3375^(1/4).
    assert geomean_speedup(df, baseline="compile") == pytest.approx(0.3375**0.25)


def test_null_speedup_counts_for_p0_only_and_no_correct_gives_nan():
    df = pd.DataFrame(
        {
            "problem_id": ["q1", "q2", "q3"],
            "level": [1, 1, 2],
            "outcome": ["correct", "correct", "timeout"],
            "speedup_eager": [None, 1.5, None],
        }
    )
    # Level 1: q1 correct with unknown speedup, q2 correct at 1.5; level 2: q3 never correct.
    assert fast_p(df, 0) == pytest.approx(2 / 3)
    assert fast_p(df, 1) == pytest.approx(1 / 3)
    assert geomean_speedup(df) == pytest.approx(1.5)  # q1 has no speedup, so only q2
    by_level = geomean_speedup(df, by=["level"])
    assert by_level[1] == pytest.approx(1.5) and math.isnan(by_level[2])
    assert fast_p(df, 0, by=["level"]).to_dict() == pytest.approx({1: 1.0, 2: 0.0})
    assert math.isnan(geomean_speedup(df[df["outcome"] != "correct"]))


def test_bad_baseline_is_rejected():
    with pytest.raises(ValueError, match="baseline"):
        fast_p(metrics_frame(), 1, baseline="cudnn")


def test_report_table():
    table = report_table(metrics_frame())
    assert list(table.columns) == [
        "level",
        "backend",
        "problems",
        "correct",
        "fast_0",
        "fast_1",
        "fast_1.5",
        "fast_2",
        "geomean_speedup",
    ]
    assert len(table) == 2
    level1, level2 = table.iloc[0], table.iloc[1]
    # Level 1: 3 problems, 2 correct; fast 2/3, 2/3, 1/3, 0 (p1's 2.0 is not > 2); geomean sqrt(2.4).
    assert (level1["level"], level1["backend"], level1["problems"], level1["correct"]) == (1, "triton", 3, 2)
    assert [level1[c] for c in ["fast_0", "fast_1", "fast_1.5", "fast_2"]] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 0])
    assert level1["geomean_speedup"] == pytest.approx(math.sqrt(2.4))
    # Level 2: 2 problems, 2 correct; fast 1, 1/2, 1/2, 1/2 (p4's 3.0 > 2); geomean 1.5.
    assert (level2["level"], level2["problems"], level2["correct"]) == (2, 2, 2)
    assert [level2[c] for c in ["fast_0", "fast_1", "fast_1.5", "fast_2"]] == pytest.approx([1, 0.5, 0.5, 0.5])
    assert level2["geomean_speedup"] == pytest.approx(1.5)

    overall = report_table(metrics_frame(), by=())
    assert len(overall) == 1
    assert overall.loc[0, "problems"] == 5 and overall.loc[0, "correct"] == 4
    assert overall.loc[0, "fast_1"] == pytest.approx(0.6)


def test_metrics_work_on_loaded_results(tmp_path):
    # level None must stay its own group rather than being dropped.
    rows = [
        attempt_row(attempt_id="a1", problem_id="x", level=1, speedup_eager=2.5),
        attempt_row(attempt_id="a2", problem_id="y", level=None, speedup_eager=1.1),
        attempt_row(attempt_id="a3", problem_id="z", level=None, outcome="timeout", speedup_eager=None),
    ]
    append_rows(tmp_path, "attempts", rows, run_id="r1", run_date=RUN_DATE)
    table = report_table(load("attempts", tmp_path), by=["level"])
    assert table["problems"].sum() == 3
    assert sorted(table["correct"]) == [1, 1]
    assert fast_p(load("attempts", tmp_path), 2) == pytest.approx(1 / 3)


def test_a_retried_attempt_supersedes_its_earlier_row(tmp_path):
    failed = attempt_row(outcome="generation_failed", error_class="endpoint_unavailable", created_at=T0)
    redone = attempt_row(outcome="correct", created_at=datetime(2025, 3, 14, 13, 0, tzinfo=timezone.utc))
    append_rows(tmp_path, "attempts", [failed], run_id="r1", run_date=RUN_DATE)
    append_rows(tmp_path, "attempts", [redone, attempt_row(attempt_id="a2")], run_id="r1", run_date=RUN_DATE)
    loaded = load("attempts", tmp_path).set_index("attempt_id")
    assert loaded.loc["a1", "outcome"] == "correct" and len(loaded) == 2
    assert len(pd.read_parquet(tmp_path / "attempts")) == 3  # nothing is rewritten on disk


def test_files_of_an_older_schema_load_with_the_new_columns_empty(tmp_path):
    old_columns = [f for f in ATTEMPTS_SCHEMA if f.name not in {"prompt_hash", "reply_cached", "recommendation"}]
    old_schema = pa.schema(old_columns, metadata={"kforge.schema_version": "1"})
    row = {k: v for k, v in attempt_row(created_at=T0).items() if k in old_schema.names}
    row["agent_config"] = "{}"
    partition = tmp_path / "attempts" / "date=2025-03-14"
    partition.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([{**row, "run_id": "r0", "schema_version": 1}], schema=old_schema),
        partition / "part-r0-old.parquet",
    )
    loaded = load("attempts", tmp_path)
    assert loaded["outcome"].tolist() == ["correct"] and loaded["schema_version"].tolist() == [1]
    assert loaded["prompt_hash"].isna().all() and loaded["reply_cached"].isna().all()


def test_the_runs_git_sha_says_when_the_checkout_has_uncommitted_changes(tmp_path, monkeypatch):
    import subprocess

    from tasks import record

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    monkeypatch.setattr(record, "PROJECT_ROOT", tmp_path)
    clean = record.git_sha()
    assert clean is not None and len(clean) == 40
    (tmp_path / "notes.txt").write_text("untracked files do not count\n")
    assert record.git_sha() == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert record.git_sha() == f"{clean}-dirty"
    monkeypatch.setattr(record, "PROJECT_ROOT", tmp_path / "not-a-checkout")
    assert record.git_sha() is None
