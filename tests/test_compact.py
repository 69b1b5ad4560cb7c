"""Tests for kforge.compact: a partition's small files become one, and no reader or crash can tell."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kforge import compact as compact_module
from kforge import results
from kforge.cli import app
from kforge.compact import COMPACTED_PREFIX, SOURCES_KEY, CompactError, compact, compact_before
from kforge.results import ATTEMPTS_SCHEMA, SCHEMA_VERSION, append_rows, load

REPO_ROOT = Path(__file__).resolve().parents[1]
D1, D2, D3 = date(2025, 3, 14), date(2025, 3, 15), date(2025, 3, 16)
T0 = datetime(2025, 3, 14, 12, 0, 0, tzinfo=timezone.utc)


def attempt(n: int, **overrides) -> dict:
    row = {
        "attempt_id": f"a{n}",
        "problem_id": f"L1/p{n % 7}",
        "level": 1,
        "iteration": n % 3,
        "outcome": "correct" if n % 2 else "compile_error",
        "candidate_source": f"# kernel {n}\n" * 20,
        "runtime_ms": 0.1 * n,
        "speedup_eager": 1.0 + n / 100,
        "agent_config": {"temperature": 0.2},
        "created_at": T0 + timedelta(seconds=n),
    }
    return {**row, **overrides}


def fill(results_dir: Path, days=(D1, D2), files_per_day: int = 12, rows_per_file: int = 2) -> None:
    """Attempts, one small file per append, a superseded attempt per day, and runs rows of two runs."""
    n = 0
    for day in days:
        run_id = f"run-{day.isoformat()}"
        for _ in range(files_per_day):
            rows = [attempt(n + i) for i in range(rows_per_file)]
            append_rows(results_dir, "attempts", rows, run_id=run_id, run_date=day)
            n += rows_per_file
        # A retried run redid the day's first attempt: load keeps this newer row.
        redone = attempt(n - 1, outcome="correct", runtime_ms=99.0, created_at=T0 + timedelta(days=1, seconds=n))
        append_rows(results_dir, "attempts", [redone], run_id=run_id, run_date=day)
        started = datetime.combine(day, datetime.min.time(), tzinfo=timezone.utc)
        for status, finished in (("running", None), ("finished", started + timedelta(hours=1))):
            run = {"status": status, "started_at": started, "finished_at": finished, "summary": {"n": n}}
            append_rows(results_dir, "runs", [run], run_id=run_id, run_date=day)


def rows(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame in a fixed row order (load's order among equal created_at may follow file order)."""
    keys = [c for c in ("attempt_id", "run_id", "status", "created_at") if c in frame.columns]
    return frame.sort_values(keys, kind="stable").reset_index(drop=True)


def raw_rows(results_dir: Path, table: str) -> pd.DataFrame:
    """Every row on disk, superseded ones and duplicates included (what plain pd.read_parquet reads)."""
    frame = pd.read_parquet(results_dir / table)
    return rows(frame.assign(date=frame["date"].astype(str)))


def snapshot(results_dir: Path) -> dict[str, pd.DataFrame]:
    return {table: rows(load(table, results_dir)) for table in ("attempts", "runs")}


def assert_same_loads(results_dir: Path, expected: dict[str, pd.DataFrame]) -> None:
    for table, frame in snapshot(results_dir).items():
        pd.testing.assert_frame_equal(frame, expected[table])


def visible(partition: Path) -> list[str]:
    return sorted(p.name for p in partition.glob("*.parquet") if not p.name.startswith((".", "_")))


def hidden(partition: Path) -> list[str]:
    return sorted(p.name for p in partition.iterdir() if p.name.startswith("."))


def partitions(results_dir: Path) -> list[Path]:
    return sorted(results_dir.glob("*/date=*"))


# --- what compaction does ----------------------------------------------------------------------------


def test_compaction_leaves_one_file_per_partition_with_the_same_rows(tmp_path):
    fill(tmp_path)
    expected = snapshot(tmp_path)
    raw = {table: raw_rows(tmp_path, table) for table in ("attempts", "runs")}
    assert len(visible(tmp_path / "attempts" / "date=2025-03-14")) == 13

    done = compact(tmp_path)

    assert [(c.table, c.date, c.files_before, c.files_after, c.changed) for c in done] == [
        ("attempts", "2025-03-14", 13, 1, True),
        ("attempts", "2025-03-15", 13, 1, True),
        ("runs", "2025-03-14", 2, 1, True),
        ("runs", "2025-03-15", 2, 1, True),
    ]
    assert [c.rows for c in done] == [25, 25, 2, 2]  # superseded rows are kept on disk: nothing is lost
    for partition in partitions(tmp_path):
        (name,) = visible(partition)
        assert name.startswith(COMPACTED_PREFIX)
        assert hidden(partition) == []  # no temporary file left behind
    assert_same_loads(tmp_path, expected)
    for table in ("attempts", "runs"):
        pd.testing.assert_frame_equal(raw_rows(tmp_path, table), raw[table])
    loaded = load("attempts", tmp_path).set_index("attempt_id")
    assert loaded.loc["a23", "runtime_ms"] == 99.0  # the redone attempt still supersedes the first row


def test_compacted_file_keeps_the_schema_and_its_metadata(tmp_path):
    fill(tmp_path, days=(D1,))
    compact(tmp_path)
    (name,) = visible(tmp_path / "attempts" / "date=2025-03-14")
    schema = pq.read_schema(tmp_path / "attempts" / "date=2025-03-14" / name)
    metadata = dict(schema.metadata)
    assert metadata[b"kforge.schema_version"] == str(SCHEMA_VERSION).encode()
    assert metadata[b"kforge.table"] == b"attempts"
    assert len(json.loads(metadata.pop(SOURCES_KEY))) == 13  # its journal
    assert schema.with_metadata(metadata).equals(ATTEMPTS_SCHEMA, check_metadata=True)
    dataset_schema = pq.read_table(tmp_path / "attempts").schema
    assert dataset_schema.metadata[b"kforge.schema_version"] == str(SCHEMA_VERSION).encode()


def write_old_schema_file(partition: Path, name: str, version: int, attempt_id: str) -> pa.Schema:
    dropped = {"prompt_hash", "reply_cached", "recommendation", "timing_source", "isolation"}
    old_schema = pa.schema(
        [f for f in ATTEMPTS_SCHEMA if f.name not in dropped],
        metadata={"kforge.table": "attempts", "kforge.schema_version": str(version)},
    )
    row = {k: v for k, v in attempt(0, attempt_id=attempt_id, agent_config="{}").items() if k in old_schema.names}
    partition.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([{**row, "run_id": "r0", "schema_version": version}], schema=old_schema)
    pq.write_table(table, partition / name)
    return old_schema


def test_rows_of_an_older_schema_version_merge_with_the_new_columns_null(tmp_path):
    partition = tmp_path / "attempts" / "date=2025-03-14"
    write_old_schema_file(partition, "part-r0-old00001.parquet", 1, "old")
    append_rows(tmp_path, "attempts", [attempt(1, timing_source="observed")], run_id="r1", run_date=D1)
    append_rows(tmp_path, "attempts", [attempt(2)], run_id="r1", run_date=D1)
    expected = snapshot(tmp_path)

    compact(tmp_path)

    (name,) = visible(partition)
    schema = pq.read_schema(partition / name)
    assert schema.names == ATTEMPTS_SCHEMA.names  # the unified schema: the newest version's columns
    assert schema.metadata[b"kforge.schema_version"] == str(SCHEMA_VERSION).encode()
    assert_same_loads(tmp_path, expected)
    loaded = load("attempts", tmp_path).set_index("attempt_id")
    assert loaded.loc["old", "schema_version"] == 1 and loaded.loc["a1", "schema_version"] == SCHEMA_VERSION
    assert pd.isna(loaded.loc["old", "timing_source"]) and loaded.loc["a1", "timing_source"] == "observed"
    assert pd.isna(loaded.loc["old", "reply_cached"])


def test_a_partition_of_old_files_only_keeps_its_old_schema_version(tmp_path):
    partition = tmp_path / "attempts" / "date=2025-03-14"
    old_schema = write_old_schema_file(partition, "part-r0-old00001.parquet", 2, "x1")
    write_old_schema_file(partition, "part-r0-old00002.parquet", 2, "x2")
    compact(tmp_path)
    (name,) = visible(partition)
    schema = pq.read_schema(partition / name)
    assert schema.metadata[b"kforge.schema_version"] == b"2"
    assert schema.remove_metadata().equals(old_schema.remove_metadata())
    assert sorted(load("attempts", tmp_path)["attempt_id"]) == ["x1", "x2"]


def test_compacting_a_compacted_partition_is_a_no_op(tmp_path):
    fill(tmp_path)
    compact(tmp_path)
    before = {p: os.stat(p) for p in tmp_path.rglob("*.parquet")}

    again = compact(tmp_path)

    assert [c.changed for c in again] == [False] * 4
    assert [(c.files_before, c.files_after) for c in again] == [(1, 1)] * 4
    assert [c.rows for c in again] == [25, 25, 2, 2]
    after = {p: os.stat(p) for p in tmp_path.rglob("*.parquet")}
    assert {p: (s.st_ino, s.st_mtime_ns) for p, s in after.items()} == {
        p: (s.st_ino, s.st_mtime_ns) for p, s in before.items()
    }


def test_files_appended_after_a_compaction_are_merged_into_the_next(tmp_path):
    fill(tmp_path, days=(D1,))
    compact(tmp_path)
    append_rows(tmp_path, "attempts", [attempt(100)], run_id="late", run_date=D1)
    append_rows(tmp_path, "attempts", [attempt(101)], run_id="late", run_date=D1)
    expected, raw = snapshot(tmp_path), raw_rows(tmp_path, "attempts")

    (done,) = compact(tmp_path, ["attempts"])

    assert (done.files_before, done.files_after, done.rows) == (3, 1, 27)
    assert_same_loads(tmp_path, expected)
    pd.testing.assert_frame_equal(raw_rows(tmp_path, "attempts"), raw)


def test_date_before_and_compact_before_choose_the_partitions(tmp_path):
    fill(tmp_path, days=(D1, D2, D3), files_per_day=3)

    assert [(c.table, c.date) for c in compact(tmp_path, ["attempts"], day=D2)] == [("attempts", "2025-03-15")]
    assert len(visible(tmp_path / "attempts" / "date=2025-03-14")) == 4
    assert len(visible(tmp_path / "runs" / "date=2025-03-15")) == 2  # another table

    done = compact_before(tmp_path, D3)  # the nightly call: every table, every day before D3
    assert [(c.table, c.date, c.changed) for c in done] == [
        ("attempts", "2025-03-14", True),
        ("attempts", "2025-03-15", False),
        ("runs", "2025-03-14", True),
        ("runs", "2025-03-15", True),
    ]
    assert len(visible(tmp_path / "attempts" / "date=2025-03-16")) == 4  # D3 itself is left alone
    assert len(compact_before(tmp_path)) == 6  # default: before today, so D3 too
    assert all(len(visible(p)) == 1 for p in partitions(tmp_path))


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        compact(tmp_path, day=D1, before=D2)
    with pytest.raises(ValueError, match="unknown results table"):
        compact(tmp_path, ["attempt"])
    assert compact(tmp_path) == []  # no results at all: nothing to do


# --- readers during compaction ---------------------------------------------------------------------


def test_concurrent_loads_during_compaction_see_every_row_once(tmp_path, monkeypatch):
    fill(tmp_path, days=(D1, D2, D3), files_per_day=30)
    expected = rows(load("attempts", tmp_path))
    files_before = sum(len(visible(p)) for p in partitions(tmp_path) if p.parent.name == "attempts")

    # Record what every load listed; hold the deletions until a load has listed old and new files at once.
    listings: list[list[str]] = []
    both_listed = threading.Event()
    real_visible, real_unlink = results._visible_files, compact_module._unlink

    def recording_visible(table_dir):
        files = real_visible(table_dir)
        names = [Path(f).name for f in files]
        listings.append(names)
        if any(n.startswith(COMPACTED_PREFIX) for n in names) and len(names) > 3:
            both_listed.set()
        return files

    def slow_unlink(path):
        assert both_listed.wait(60), "no load listed the old and the new files together"
        time.sleep(0.002)  # widen the window in which loads list files that go away before they are read
        real_unlink(path)

    monkeypatch.setattr(results, "_visible_files", recording_visible)
    monkeypatch.setattr(compact_module, "_unlink", slow_unlink)

    stop, started = threading.Event(), threading.Event()
    loads: list[tuple[int, int, bool]] = []  # rows, distinct attempt ids, equal to the expected rows
    errors: list[BaseException] = []

    def reader():
        while not stop.is_set():
            try:
                frame = rows(load("attempts", tmp_path))
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
                return
            loads.append((len(frame), frame["attempt_id"].nunique(), frame.equals(expected)))
            started.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert started.wait(60)
    loads_before = len(loads)
    compact(tmp_path, ["attempts"])
    loads_during = len(loads) - loads_before
    stop.set()
    thread.join(60)

    assert errors == []
    assert loads_during >= 1
    assert all(ok for _, _, ok in loads), [entry for entry in loads if not entry[2]][:3]
    assert {(n, distinct) for n, distinct, _ in loads} == {(len(expected), len(expected))}
    # The loads did run through every state: the old files, old and new together, the new ones only.
    sizes = {len(names) for names in listings}
    assert files_before in sizes and any(3 < size <= files_before + 3 for size in sizes if size != files_before)
    assert both_listed.is_set()
    assert all(len(visible(p)) == 1 for p in partitions(tmp_path) if p.parent.name == "attempts")


def test_a_load_that_listed_files_a_compaction_then_deleted_lists_again(tmp_path, monkeypatch):
    fill(tmp_path)
    expected = snapshot(tmp_path)
    real_visible = results._visible_files
    listed: list[int] = []

    def list_then_compact(table_dir):
        files = real_visible(table_dir)
        listed.append(len(files))
        if len(listed) == 1:
            compact(tmp_path, ["attempts"])  # every file just listed is gone before the load reads it
        return files

    monkeypatch.setattr(results, "_visible_files", list_then_compact)
    frame = rows(load("attempts", tmp_path))
    monkeypatch.undo()

    assert listed == [26, 2]
    pd.testing.assert_frame_equal(frame, expected["attempts"])


def test_a_file_appended_during_compaction_is_kept(tmp_path, monkeypatch):
    fill(tmp_path, days=(D1,))
    real_publish = compact_module._publish

    def append_then_publish(hidden_path, final):
        append_rows(tmp_path, "attempts", [attempt(500)], run_id="concurrent", run_date=D1)
        real_publish(hidden_path, final)

    monkeypatch.setattr(compact_module, "_publish", append_then_publish)
    compact(tmp_path, ["attempts"])
    monkeypatch.undo()

    names = visible(tmp_path / "attempts" / "date=2025-03-14")
    assert len(names) == 2 and any(n.startswith("part-concurrent-") for n in names)
    assert "a500" in set(load("attempts", tmp_path)["attempt_id"])
    assert len(load("attempts", tmp_path)) == 25
    compact(tmp_path, ["attempts"])
    assert len(visible(tmp_path / "attempts" / "date=2025-03-14")) == 1
    assert len(load("attempts", tmp_path)) == 25


def test_two_compactions_at_once_take_turns(tmp_path):
    fill(tmp_path)
    expected, raw = snapshot(tmp_path), raw_rows(tmp_path, "attempts")
    failures: list[BaseException] = []

    def run():
        try:
            compact(tmp_path)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert all(len(visible(p)) == 1 for p in partitions(tmp_path))
    assert_same_loads(tmp_path, expected)
    pd.testing.assert_frame_equal(raw_rows(tmp_path, "attempts"), raw)  # no file's rows were merged twice


# --- crashes ----------------------------------------------------------------------------------------

KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from kforge import compact

    results_dir, stage = sys.argv[1], sys.argv[2]
    real_publish, real_unlink, unlinked = compact._publish, compact._unlink, []

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def publish(hidden, final):
        if stage == "written":  # the merged file is complete and fsynced under its hidden name
            die()
        real_publish(hidden, final)
        if stage == "published":  # the merged file is visible, no source is deleted yet
            die()

    def unlink(path):
        real_unlink(path)
        unlinked.append(path)
        if stage == "deleting" and len(unlinked) == 5:  # some sources deleted, the others not
            die()

    compact._publish, compact._unlink = publish, unlink
    compact.compact(results_dir)
    """
)


@pytest.mark.parametrize("stage", ["written", "published", "deleting"])
def test_a_compaction_killed_at_any_step_loses_nothing(tmp_path, stage):
    fill(tmp_path)
    expected = snapshot(tmp_path)
    raw = {table: raw_rows(tmp_path, table) for table in ("attempts", "runs")}
    first = tmp_path / "attempts" / "date=2025-03-14"
    old_names = visible(first)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path), stage], env=env, timeout=120)
    assert child.returncode == -signal.SIGKILL

    names = visible(first)
    compacted = [n for n in names if n.startswith(COMPACTED_PREFIX)]
    if stage == "written":
        assert names == old_names and compacted == []
        assert [n for n in hidden(first) if n.startswith(f".{COMPACTED_PREFIX}")] != []
    elif stage == "published":
        assert len(compacted) == 1 and sorted(set(names) - set(compacted)) == old_names  # old and new at once
    else:
        assert len(compacted) == 1 and len(names) == len(old_names) + 1 - 5
    assert_same_loads(tmp_path, expected)  # whatever the moment, load returns exactly the rows it did

    compact(tmp_path)  # the next compaction finishes or discards the killed one's work

    for partition in partitions(tmp_path):
        assert len(visible(partition)) == 1 and hidden(partition) == []
    assert_same_loads(tmp_path, expected)
    for table in ("attempts", "runs"):
        pd.testing.assert_frame_equal(raw_rows(tmp_path, table), raw[table])  # and no row is on disk twice


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    fill(tmp_path, days=(D1,))
    partition = tmp_path / "attempts" / "date=2025-03-14"
    before = sorted(p.name for p in partition.iterdir())

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(compact_module.pq, "write_table", no_space)
    with pytest.raises(CompactError, match="No space left on device"):
        compact(tmp_path, ["attempts"])
    monkeypatch.undo()
    assert sorted(p.name for p in partition.iterdir()) == before  # no temporary file, no source deleted


def test_a_failure_while_deleting_sources_is_finished_by_the_next_compaction(tmp_path, monkeypatch):
    fill(tmp_path, days=(D1,))
    expected, raw = snapshot(tmp_path), raw_rows(tmp_path, "attempts")
    real_unlink, calls = compact_module._unlink, []

    def failing_unlink(path):
        calls.append(path)
        if len(calls) == 4:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        real_unlink(path)

    monkeypatch.setattr(compact_module, "_unlink", failing_unlink)
    with pytest.raises(PermissionError):
        compact(tmp_path, ["attempts"])
    monkeypatch.undo()
    assert len(visible(tmp_path / "attempts" / "date=2025-03-14")) == 13 + 1 - 3
    assert_same_loads(tmp_path, expected)

    (done,) = compact(tmp_path, ["attempts"])
    assert (done.files_before, done.files_after) == (11, 1)
    assert_same_loads(tmp_path, expected)
    pd.testing.assert_frame_equal(raw_rows(tmp_path, "attempts"), raw)


# --- the command ------------------------------------------------------------------------------------


def test_kforge_compact_command(tmp_path):
    fill(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["compact", "--results", str(tmp_path), "--table", "attempts", "--date", "2025-03-14"])
    assert result.exit_code == 0, result.output
    assert "attempts date=2025-03-14: 13 files -> 1 (25 rows)" in result.output
    assert "1 partition(s) compacted, 0 already compact" in result.output
    assert len(visible(tmp_path / "attempts" / "date=2025-03-15")) == 13

    result = runner.invoke(app, ["compact", "--results", str(tmp_path)])  # every table, before today
    assert result.exit_code == 0, result.output
    assert "3 partition(s) compacted, 1 already compact" in result.output

    for args in (["--date", "2025-03-14", "--before", "2025-03-15"], ["--date", "14/03/2025"], ["--table", "nope"]):
        result = runner.invoke(app, ["compact", "--results", str(tmp_path), *args])
        assert result.exit_code == 2, (args, result.output)
