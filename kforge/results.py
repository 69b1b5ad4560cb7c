"""Append-only Parquet results: every evaluated kernel candidate and every run, plus the metrics on them.

Layout: ``<results_dir>/<table>/date=YYYY-MM-DD/part-<run_id>-<uuid8>.parquet`` (hive partitioned by
run date). Files are written once and never modified; readers skip names starting with '.' or '_'.
`kforge compact` (kforge/compact.py) replaces a partition's files by one holding the same rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Sequence
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tasks.harness.protocol import OUTCOMES  # one list, shared with the harness

# 2: agents F and G; 3: the LLM soft check; 4: the trust boundary's evidence; 5: eager_source; 6: kb_updates.tokens;
# 7: attempts.host and the GPU it ran on (gpu_index, gpu_name, gpu_uuid); 8: retimed_from
SCHEMA_VERSION = 8


RUN_STATUSES = ("running", "finished", "failed")
BASELINES = ("eager", "compile", "best")
# What a person reads first of an attempt: `kforge run`'s table and the run's Prefect artifact.
SUMMARY_COLUMNS = (
    "problem_id",
    "iteration",
    "outcome",
    "error_class",
    "runtime_ms",
    "eager_ms",
    "compile_ms",
    "speedup_eager",
    "speedup_compile",
)

_UTC_TIMESTAMP = pa.timestamp("us", tz="UTC")


def _schema(table: str, fields: list[tuple[str, pa.DataType]]) -> pa.Schema:
    metadata = {"kforge.table": table, "kforge.schema_version": str(SCHEMA_VERSION)}
    return pa.schema([pa.field(name, dtype) for name, dtype in fields], metadata=metadata)


ATTEMPTS_SCHEMA = _schema(
    "attempts",
    [
        ("attempt_id", pa.string()),
        ("run_id", pa.string()),
        ("schema_version", pa.int16()),
        ("problem_id", pa.string()),
        ("problem_hash", pa.string()),
        ("level", pa.int16()),
        ("suite", pa.string()),
        ("backend", pa.string()),
        ("device", pa.string()),
        ("size_preset", pa.string()),
        ("model", pa.string()),
        ("agent", pa.string()),
        ("agent_config", pa.string()),
        ("max_iterations", pa.int32()),
        ("reference_backend", pa.string()),
        ("performance_agent", pa.bool_()),
        ("prompt_hash", pa.string()),
        ("reply_cached", pa.bool_()),
        ("iteration", pa.int32()),
        ("rollout", pa.int32()),
        ("parent_attempt", pa.string()),
        ("outcome", pa.string()),
        ("error_class", pa.string()),
        ("error_excerpt", pa.string()),
        ("source_hash", pa.string()),
        ("candidate_source", pa.string()),
        ("compile_s", pa.float64()),
        ("runtime_ms", pa.float64()),
        ("runtime_p10_ms", pa.float64()),
        ("runtime_p90_ms", pa.float64()),
        ("eager_ms", pa.float64()),
        ("compile_ms", pa.float64()),
        ("speedup_eager", pa.float64()),
        ("speedup_compile", pa.float64()),
        ("speedup_best", pa.float64()),
        ("atol", pa.float64()),
        ("rtol", pa.float64()),
        ("allow_library_calls", pa.bool_()),
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("cost_usd", pa.float64()),
        ("recommendation", pa.string()),
        ("analysis_error", pa.string()),
        ("analysis_tokens_in", pa.int64()),
        ("analysis_tokens_out", pa.int64()),
        ("soft_check", pa.string()),  # "pass", "fail", or null when not run
        ("soft_check_reason", pa.string()),
        ("soft_check_error", pa.string()),
        ("soft_check_tokens_in", pa.int64()),
        ("soft_check_tokens_out", pa.int64()),
        # how the time was decided (tasks/drive.py): "claimed" or "observed", both medians, and the
        # seeds of the timed calls whose outputs the orchestrator judged (JSON list)
        ("timing_source", pa.string()),
        # eager_ms timed beside the candidate's calls ("paired") or by the problem's baseline stage ("baseline")
        ("eager_source", pa.string()),
        # the floor that refuted a cpu stage's claims, where a fresh pair timed it again (tasks/measure.py)
        ("retimed_from", pa.string()),
        ("claimed_ms", pa.float64()),
        ("observed_ms", pa.float64()),
        ("judged_seeds", pa.string()),
        ("roofline_fraction", pa.float64()),
        ("roofline_suspect", pa.bool_()),
        ("isolation", pa.string()),  # the worker's sandbox layers (JSON), as its last stage reported them
        ("host", pa.string()),  # the host that judged it: $KFORGE_HOST, or its hostname
        ("gpu_index", pa.int32()),  # the GPU its stages ran on, as this process numbers them (null on the cpu)
        ("gpu_name", pa.string()),
        ("gpu_uuid", pa.string()),
        ("created_at", _UTC_TIMESTAMP),
    ],
)

RUNS_SCHEMA = _schema(
    "runs",
    [
        ("run_id", pa.string()),
        ("schema_version", pa.int16()),
        ("status", pa.string()),
        ("git_sha", pa.string()),
        ("config", pa.string()),
        ("host", pa.string()),
        ("device", pa.string()),
        ("gpu_name", pa.string()),
        ("driver", pa.string()),
        ("toolchain", pa.string()),
        ("torch_version", pa.string()),
        ("python_version", pa.string()),
        ("started_at", _UTC_TIMESTAMP),
        ("finished_at", _UTC_TIMESTAMP),
        ("summary", pa.string()),
    ],
)

SCHEMAS = {"attempts": ATTEMPTS_SCHEMA, "runs": RUNS_SCHEMA}

# Columns holding JSON text; dicts and lists given for them are serialised on write.
_JSON_COLUMNS = {"agent_config", "config", "toolchain", "summary", "recommendation"}

_PARTITIONING = ds.partitioning(pa.schema([("date", pa.string())]), flavor="hive")

# Keep integer and bool columns integer/bool when they hold nulls (plain to_pandas turns them into floats).
_PANDAS_TYPES = {
    pa.int16(): pd.Int16Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
    pa.bool_(): pd.BooleanDtype(),
}


class ResultsWriteError(Exception):
    """A results file could not be written (disk full, permissions, a path that is not a directory)."""


def _schema_for(table: str) -> pa.Schema:
    if table not in SCHEMAS:
        raise ValueError(f"unknown results table {table!r}; expected one of {sorted(SCHEMAS)}")
    return SCHEMAS[table]


def _check_row_values(table: str, rows: list[dict[str, Any]], run_id: str) -> None:
    for index, row in enumerate(rows):
        if row.get("run_id") != run_id:
            raise ValueError(f"row {index} has run_id {row.get('run_id')!r}, expected {run_id!r}")
        if table == "attempts" and row.get("outcome") not in OUTCOMES:
            raise ValueError(f"row {index} has outcome {row.get('outcome')!r}; expected one of {OUTCOMES}")
        if table == "runs" and row.get("status") not in RUN_STATUSES:
            raise ValueError(f"row {index} has status {row.get('status')!r}; expected one of {RUN_STATUSES}")


def _to_arrow(table: str, rows: list[dict[str, Any]], run_id: str) -> pa.Table:
    """Rows (dicts keyed by column) -> an Arrow table with exactly the table's schema."""
    schema = _schema_for(table)
    unknown = sorted({key for row in rows for key in row} - set(schema.names))
    if unknown:
        raise ValueError(f"unknown columns for table {table!r}: {unknown}")
    defaults: dict[str, Any] = {"run_id": run_id, "schema_version": SCHEMA_VERSION}
    if table == "attempts":
        defaults["created_at"] = datetime.now(timezone.utc)
    filled = [{**defaults, **row} for row in rows]
    _check_row_values(table, filled, run_id)

    columns = []
    for field in schema:
        values = [row.get(field.name) for row in filled]
        if field.name in _JSON_COLUMNS:
            values = [json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v for v in values]
        try:
            columns.append(pa.array(values, type=field.type, from_pandas=True))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"column {field.name!r} of table {table!r}: {exc}") from exc
    return pa.Table.from_arrays(columns, schema=schema)


def append_rows(
    results_dir: str | Path,
    table: str,
    rows: list[dict[str, Any]],
    run_id: str,
    run_date: date | None = None,
) -> Path:
    """Write ``rows`` (dicts keyed by column name) as one new Parquet file of ``table``; return its path.

    Missing columns become null; ``run_id``, ``schema_version`` (and ``created_at`` for attempts) are
    filled in when absent. The file appears under its final name only once completely written.
    Raises ValueError for bad rows and ResultsWriteError when the file cannot be written.
    """
    if not rows:
        raise ValueError("append_rows needs at least one row")
    if not run_id or "/" in run_id or "\\" in run_id or run_id.startswith((".", "_")):
        raise ValueError(f"run_id {run_id!r} cannot be used in a file name")
    arrow_table = _to_arrow(table, rows, run_id)

    run_date = run_date or datetime.now(timezone.utc).date()
    partition_dir = Path(results_dir) / table / f"date={run_date.isoformat()}"
    final_path = partition_dir / f"part-{run_id}-{uuid.uuid4().hex[:8]}.parquet"
    # A leading '.' hides the partial file from dataset discovery until os.replace publishes it.
    temp_path = partition_dir / f".{final_path.name}.tmp"
    try:
        partition_dir.mkdir(parents=True, exist_ok=True)
        with open(temp_path, "wb") as sink:
            pq.write_table(arrow_table, sink)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temp_path, final_path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp_path.unlink(missing_ok=True)
        reason = exc.strerror or str(exc)
        if exc.filename:
            reason = f"{reason}: {exc.filename}"
        message = f"could not write results file {final_path}: {reason}"
        raise ResultsWriteError(" ".join(message.split())) from exc
    _fsync_dir(partition_dir)
    return final_path


def _fsync_dir(directory: Path) -> None:
    # Makes the rename durable; the data is already safe and visible, so failure here is not an error.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _visible_files(table_dir: Path) -> list[str]:
    paths = sorted(table_dir.glob("date=*/*.parquet"))
    return [str(p) for p in paths if p.is_file() and not p.name.startswith((".", "_"))]


def _empty_frame(schema: pa.Schema) -> pd.DataFrame:
    frame = schema.empty_table().to_pandas(types_mapper=_PANDAS_TYPES.get)
    frame["date"] = pd.Series([], dtype="str")
    return frame


_READ_TRIES = 1000  # a compaction deletes its sources one by one: a load may list again for each


def _read_visible(table_dir: Path, schema: pa.Schema) -> pa.Table | None:
    """The rows of every visible file of a table (None if there is none). kforge.compact deletes files
    once the file holding their rows is visible; a read that listed one of them lists again."""
    for tries_left in range(_READ_TRIES - 1, -1, -1):
        files = _visible_files(table_dir) if table_dir.is_dir() else []
        if not files:
            return None
        try:
            dataset = ds.dataset(
                files,
                schema=schema.append(pa.field("date", pa.string())),
                format="parquet",
                partitioning=_PARTITIONING,
                partition_base_dir=str(table_dir),
            )
            return dataset.to_table()
        except FileNotFoundError:
            if not tries_left:
                raise
    return None


def load(table: str = "attempts", results_dir: str | Path = "data/results") -> pd.DataFrame:
    """Read every visible file of ``table`` into a DataFrame with the schema's columns plus ``date``.

    Integer and bool columns use pandas' nullable dtypes. For ``runs`` only the latest row per run_id
    is kept (a 'finished' or 'failed' row replaces the 'running' row); for ``attempts`` the newest row
    per attempt_id (a retried run that redid an attempt wrote a second one); for ``profiles`` every row. An absent
    table gives an empty frame.
    """
    schema = _schema_for(table)
    arrow_table = _read_visible(Path(results_dir) / table, schema)
    if arrow_table is None:
        return _empty_frame(schema)
    frame = arrow_table.to_pandas(types_mapper=_PANDAS_TYPES.get)
    if table == "runs":
        return _latest_run_rows(frame)
    frame = frame.sort_values("created_at", kind="stable", na_position="first")
    if table in ("profiles", "kb_updates"):  # many rows per attempt (or none), every one kept
        return frame.reset_index(drop=True)
    # A retried run that redid an attempt (say the model endpoint was down the first time) wrote a newer row.
    return frame.drop_duplicates("attempt_id", keep="last").reset_index(drop=True)


def _latest_run_rows(runs: pd.DataFrame) -> pd.DataFrame:
    is_final = runs["status"].isin(["finished", "failed"]).astype(int)
    ordered = runs.assign(_final=is_final).sort_values(
        ["_final", "finished_at", "started_at"], na_position="first", kind="stable"
    )
    latest = ordered.drop_duplicates("run_id", keep="last").drop(columns="_final")
    return latest.sort_values("started_at", kind="stable").reset_index(drop=True)


def _speedup_column(baseline: str) -> str:
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    return f"speedup_{baseline}"


def best_per_problem(df: pd.DataFrame, by: Sequence[str], baseline: str = "eager") -> pd.DataFrame:
    """Attempts -> one row per (``by`` + problem_id) with ``correct`` (any correct attempt) and
    ``speedup_<baseline>`` (the best speedup among correct attempts, NaN if none)."""
    speedup_col = _speedup_column(baseline)
    keys = list(dict.fromkeys([*by, "problem_id"]))
    missing = [c for c in [*keys, "outcome", speedup_col] if c not in df.columns]
    if missing:
        raise KeyError(f"attempts frame lacks columns {missing}")
    is_correct = df["outcome"].eq("correct").fillna(False).astype(bool)
    speedups = pd.to_numeric(df[speedup_col], errors="coerce").astype("float64")
    work = df[keys].assign(_correct=is_correct, _speedup=speedups.where(is_correct))
    best = work.groupby(keys, dropna=False, sort=True).agg(
        correct=("_correct", "any"), best_speedup=("_speedup", "max")
    )
    return best.rename(columns={"best_speedup": speedup_col}).reset_index()


def _per_group(values: pd.Series, best: pd.DataFrame, by: Sequence[str], how: str) -> float | pd.Series:
    """Aggregate per-problem ``values`` over all problems (no ``by``) or per group."""
    if not by:
        return float(values.agg(how))
    return values.groupby([best[c] for c in by], dropna=False, sort=True).agg(how)


def _fast_p_of(best: pd.DataFrame, p: float, by: Sequence[str], speedup_col: str) -> float | pd.Series:
    # Speedups are positive, so for p <= 0 "speedup > p" reduces to correctness, null speedups included.
    hit = best["correct"] if p <= 0 else best[speedup_col].gt(p)
    return _per_group(hit.astype(float), best, by, "mean")


def _geomean_of(best: pd.DataFrame, by: Sequence[str], speedup_col: str) -> float | pd.Series:
    speedups = best[speedup_col].where(best[speedup_col] > 0)
    result = _per_group(np.log(speedups), best, by, "mean")
    return np.exp(result) if isinstance(result, pd.Series) else float(np.exp(result))


def fast_p(df: pd.DataFrame, p: float, by: Sequence[str] | None = None, baseline: str = "eager") -> float | pd.Series:
    """Attempts -> fraction of distinct problems with a correct attempt whose speedup exceeds ``p``.

    ``p = 0`` is the correctness rate. Returns a float, or with ``by`` a Series indexed by the groups.
    """
    return fast_p_curve(df, [p], by, baseline)[0]


def fast_p_curve(
    df: pd.DataFrame, ps: Sequence[float], by: Sequence[str] | None = None, baseline: str = "eager"
) -> list[float | pd.Series]:
    """``fast_p`` at each of ``ps``, the best attempt per problem taken once for all of them."""
    by = list(by or [])
    best, speedup_col = best_per_problem(df, by, baseline), _speedup_column(baseline)
    return [_fast_p_of(best, p, by, speedup_col) for p in ps]


def geomean_speedup(df: pd.DataFrame, by: Sequence[str] | None = None, baseline: str = "eager") -> float | pd.Series:
    """Attempts -> geometric mean over problems of the best correct speedup (problems without one are
    skipped; NaN if none). Returns a float, or with ``by`` a Series indexed by the groups."""
    by = list(by or [])
    speedup_col = _speedup_column(baseline)
    return _geomean_of(best_per_problem(df, by, baseline), by, speedup_col)


def report_table(
    df: pd.DataFrame,
    ps: Sequence[float] = (0, 1, 1.5, 2),
    by: Sequence[str] = ("level", "backend"),
    baseline: str = "eager",
) -> pd.DataFrame:
    """Attempts -> one row per group: ``by`` columns, problems, correct (problem counts),
    ``fast_<p>`` for each p (e.g. fast_1.5) and geomean_speedup."""
    by = list(by)
    speedup_col = _speedup_column(baseline)
    best = best_per_problem(df, by, baseline)
    columns: dict[str, Any] = {
        "problems": _per_group(best["problem_id"], best, by, "size"),
        "correct": _per_group(best["correct"].astype(int), best, by, "sum"),
    }
    for p in ps:
        columns[f"fast_{p:g}"] = _fast_p_of(best, p, by, speedup_col)
    columns["geomean_speedup"] = _geomean_of(best, by, speedup_col)
    if not by:
        return pd.DataFrame({name: [value] for name, value in columns.items()}).astype(
            {"problems": int, "correct": int}
        )
    return pd.DataFrame(columns).reset_index()


# --- profiles: the profile stage's metrics (tasks/profile.py), advisory, never a verdict or a time ---

PROFILE_TOOLS = ("torch.profiler", "ncu")

PROFILES_SCHEMA = _schema(
    "profiles",
    [
        ("attempt_id", pa.string()),  # null for a profile of the problem's reference Model
        ("run_id", pa.string()),
        ("schema_version", pa.int16()),
        ("problem_id", pa.string()),
        ("kernel", pa.string()),  # an op, a kernel, or the model's forward (e.g. "ModelNew.forward")
        ("instance", pa.string()),  # torch.profiler: the input shapes; ncu: the kernel launch's ID
        ("section", pa.string()),  # torch.profiler: cpu_ops | cuda_kernels; ncu: its section name
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("unit", pa.string()),
        ("tool", pa.string()),  # one of PROFILE_TOOLS
        ("tool_version", pa.string()),
        ("created_at", _UTC_TIMESTAMP),
    ],
)
SCHEMAS["profiles"] = PROFILES_SCHEMA


# --- kb_updates: what each knowledge-base update changed and why (tasks/knowledge.py, tasks/optimize.py) ---

KB_UPDATES_SCHEMA = _schema(
    "kb_updates",
    [
        ("kb_version", pa.int32()),  # the version the update produced (data/knowledge or <cache_dir>/knowledge)
        ("run_id", pa.string()),
        ("schema_version", pa.int16()),
        ("problem_id", pa.string()),  # the problem whose rollouts were measured
        ("state", pa.string()),
        ("technique", pa.string()),
        ("expected_gain", pa.float64()),  # after the update
        ("measured_gain", pa.float64()),  # mean over the correct rollouts; null when none was correct
        ("rationale", pa.string()),
        ("attempt_ids", pa.list_(pa.string())),  # the rollouts' attempts
        # model tokens (in + out) of a step's state and gap-analysis calls, on that step's row whose technique
        # is empty and whose rationale says so; null on the other rows
        ("tokens", pa.int64()),
        ("created_at", _UTC_TIMESTAMP),
    ],
)
SCHEMAS["kb_updates"] = KB_UPDATES_SCHEMA
