"""Compaction: rewrite a date partition's many small Parquet files into one, so results stay fast to load.

Every attempt is its own small file (``kforge.results.append_rows``); a month of nightly runs is tens of
thousands of files, and reading them costs far more than their rows. ``compact`` merges the visible
files of each chosen ``<table>/date=YYYY-MM-DD/`` partition into ``part-compacted-<uuid8>.parquet``:

1. list the partition's visible files (the sources) and read them into one table with the unified
   schema: the columns of every source, rows of an older schema version get nulls in the columns
   they lack; the schema metadata (``kforge.table``, ``kforge.schema_version``) is that of the newest
   source, plus ``kforge.compacted_from``: the sources' names, the compaction's own journal;
2. write it under a hidden name (``.part-compacted-<uuid8>.parquet.tmp``; readers skip names
   starting with '.'), fsync it;
3. publish it with one ``os.replace`` to its visible name, fsync the directory;
4. delete the sources, fsync the directory.

Nothing is ever not visible: the merged file is visible before any source goes, so a reader never
sees neither. Between 3 and 4 it sees both, and ``kforge.results.load`` keeps one row per key
(``attempt_id``; ``run_id`` for runs), so it returns exactly the same rows throughout; a load that
listed a source before step 4 removed it lists again (``results._read_visible``). Plain readers
without that (``pd.read_parquet``) can see the rows twice in that window. A killed compaction
loses nothing: before step 3 it leaves a hidden file, which the next compaction removes; after it,
the next compaction reads the journal of each visible compacted file and deletes the sources that
are still there, then goes on. Files appended while a partition is compacted are not sources, so
they stay and are merged the next time. A partition with one visible file is left as it is, so
compacting a compacted partition is a no-op. One compaction at a time per table (an flock on
``<table>/.compact.lock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kforge.results import SCHEMAS, _fsync_dir

TABLES = ("attempts", "runs", "profiles", "kb_updates")  # the results tables `kforge compact --table all` covers
COMPACTED_PREFIX = "part-compacted-"
SOURCES_KEY = b"kforge.compacted_from"  # JSON list of the file names a compacted file holds the rows of
VERSION_KEY = b"kforge.schema_version"
LOCK_NAME = ".compact.lock"
PARTITION_PREFIX = "date="


class CompactError(Exception):
    """A partition could not be compacted (an unreadable source, a failed write); nothing was changed."""


@dataclass(frozen=True)
class Compaction:
    """What compacting one partition did: ``files_before`` visible files became ``files_after``."""

    table: str
    date: str
    files_before: int
    files_after: int
    rows: int

    @property
    def changed(self) -> bool:
        return self.files_before != self.files_after


def _visible(partition: Path) -> list[Path]:
    """The files readers see in a partition, as ``kforge.results.load`` lists them."""
    paths = sorted(partition.glob("*.parquet"))
    return [p for p in paths if p.is_file() and not p.name.startswith((".", "_"))]


def _sources_of(path: Path) -> list[str]:
    """The file names a compacted file holds the rows of (its journal), from its footer."""
    metadata = pq.read_schema(path).metadata or {}
    return json.loads(metadata.get(SOURCES_KEY, b"[]"))


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def _finish_interrupted(partition: Path, files: list[Path]) -> list[Path]:
    """Delete the sources a published compacted file already holds (left by a killed compaction);
    return the visible files that remain."""
    if len(files) < 2:
        return files
    names = {p.name for p in files}
    covered: set[str] = set()
    for path in files:
        if path.name.startswith(COMPACTED_PREFIX):
            covered |= names & set(_sources_of(path)) - {path.name}
    for name in sorted(covered):
        _unlink(partition / name)
    if covered:
        _fsync_dir(partition)
    return [p for p in files if p.name not in covered]


def _version(schema: pa.Schema) -> int:
    with contextlib.suppress(ValueError, TypeError):
        return int((schema.metadata or {}).get(VERSION_KEY, b"0"))
    return 0


def _merge(files: list[Path]) -> pa.Table:
    """The rows of ``files`` in listing order as one table with the unified schema."""
    tables = []
    for path in files:
        try:
            with open(path, "rb") as source:
                tables.append(pq.read_table(source))
        except (OSError, pa.ArrowException) as exc:
            raise CompactError(f"cannot read {path}: {exc}") from exc
    # The newest schema version first: its column order and metadata lead; older files' rows get nulls.
    by_version = sorted((t.schema for t in tables), key=_version, reverse=True)
    unified = pa.unify_schemas(by_version, promote_options="permissive")
    conformed = []
    for table in tables:
        columns = [
            table.column(field.name).cast(field.type)
            if field.name in table.schema.names
            else pa.nulls(table.num_rows, field.type)
            for field in unified
        ]
        conformed.append(pa.Table.from_arrays(columns, schema=unified))
    metadata = {**(unified.metadata or {}), SOURCES_KEY: json.dumps([p.name for p in files]).encode()}
    return pa.concat_tables(conformed).replace_schema_metadata(metadata)


def _write_hidden(merged: pa.Table, partition: Path) -> tuple[Path, Path]:
    """Write ``merged`` under a name readers skip and fsync it; return (hidden path, final path)."""
    final = partition / f"{COMPACTED_PREFIX}{uuid.uuid4().hex[:8]}.parquet"
    hidden = partition / f".{final.name}.tmp"
    try:
        with open(hidden, "wb") as sink:
            pq.write_table(merged, sink)
            sink.flush()
            os.fsync(sink.fileno())
    except (OSError, pa.ArrowException) as exc:
        with contextlib.suppress(OSError):
            hidden.unlink(missing_ok=True)
        raise CompactError(f"cannot write the compacted file of {partition}: {exc}") from exc
    return hidden, final


def _publish(hidden: Path, final: Path) -> None:
    """One rename makes the merged file visible (its sources still are too); fsync makes it durable."""
    os.replace(hidden, final)
    _fsync_dir(final.parent)


def _remove_sources(partition: Path, files: list[Path]) -> None:
    for path in files:
        _unlink(path)
    _fsync_dir(partition)


def _remove_leftovers(partition: Path) -> None:
    """Hidden merged files of a compaction killed before publishing (only compaction writes these)."""
    for path in partition.glob(f".{COMPACTED_PREFIX}*.parquet.tmp"):
        _unlink(path)


@contextlib.contextmanager
def _table_lock(table_dir: Path) -> Iterator[None]:
    with open(table_dir / LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _prepare(table: str, partition: Path) -> tuple[Compaction, list[Path]]:
    """Steps 1-3 for one partition: the merged file is published; returns the sources left to delete."""
    day = partition.name.removeprefix(PARTITION_PREFIX)
    _remove_leftovers(partition)
    before = _visible(partition)
    files = _finish_interrupted(partition, before)
    if len(files) < 2:
        rows = sum(pq.read_metadata(p).num_rows for p in files)
        return Compaction(table, day, len(before), len(files), rows), []
    merged = _merge(files)
    hidden, final = _write_hidden(merged, partition)
    _publish(hidden, final)
    return Compaction(table, day, len(before), 1, merged.num_rows), files


def _partitions(table_dir: Path, day: date | None, before: date | None) -> list[Path]:
    chosen = []
    for path in sorted(table_dir.glob(f"{PARTITION_PREFIX}*")):
        try:
            when = date.fromisoformat(path.name.removeprefix(PARTITION_PREFIX))
        except ValueError:
            continue  # not a partition of ours (a hidden or foreign folder)
        if path.is_dir() and (day is None or when == day) and (before is None or when < before):
            chosen.append(path)
    return chosen


def compact(
    results_dir: str | Path,
    tables: Iterable[str] | None = None,
    day: date | None = None,
    before: date | None = None,
) -> list[Compaction]:
    """Compact the partitions of ``tables`` (default: every results table present) for run date ``day``,
    or every one older than ``before`` (neither: every partition). Returns one Compaction per partition
    looked at, in table and date order. Raises CompactError; partitions already published stay so."""
    if day is not None and before is not None:
        raise ValueError("give a date or a before date, not both")
    known = sorted({*TABLES, *SCHEMAS})
    names = list(tables) if tables is not None else known
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown results table(s) {unknown}; expected some of {known}")
    done: list[Compaction] = []
    for table in names:
        table_dir = Path(results_dir) / table
        if not table_dir.is_dir():
            continue
        with _table_lock(table_dir):
            # Publish every partition first, then delete all the sources at once: a long load that
            # listed files before the deletions has to list again once, not once per partition.
            to_remove: list[tuple[Path, list[Path]]] = []
            try:
                for partition in _partitions(table_dir, day, before):
                    compaction, sources = _prepare(table, partition)
                    done.append(compaction)
                    to_remove.append((partition, sources))
            finally:
                for partition, sources in to_remove:
                    _remove_sources(partition, sources)
    return done


def compact_before(results_dir: str | Path, day: date | None = None) -> list[Compaction]:
    """Compact every partition of every table older than ``day`` (default: today, UTC): the nightly
    run's call, so yesterday's partition, finished, is one file. Compacted partitions are a no-op."""
    return compact(results_dir, before=day or datetime.now(timezone.utc).date())
