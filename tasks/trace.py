"""Where a run's wall time goes: timed spans as JSON lines in the file `$KFORGE_TRACE` names.

Off unless that variable is set (one `os.environ` read per span). Each line is one span:
{"span": name, "start": unix seconds, "s": seconds, "problem": id or null, "thread": name, ...labels}.
The spans that matter for throughput: `slot-wait` and `slot` (a stage's wait for, and hold of, the
GPU slot or the CPU cores, by `mode`), `worker-ready` (inside the slot: from the request to the
worker's set-up reply), `runtime` (this process building the reference's runtime), `calls` (the
timed or checked calls). `summary` turns a trace into the table benchmarks/kernelbench_suite.py prints.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TRACE_ENV = "KFORGE_TRACE"
_problem: contextvars.ContextVar[str | None] = contextvars.ContextVar("kforge_trace_problem", default=None)
_write_lock = threading.Lock()


def tracing() -> bool:
    return bool(os.environ.get(TRACE_ENV))


@contextlib.contextmanager
def for_problem(problem_id: str) -> Iterator[None]:
    """Label the spans of this block (and of threads started with its context) with `problem_id`."""
    token = _problem.set(problem_id)
    try:
        yield
    finally:
        _problem.reset(token)


def record(name: str, start: float, seconds: float, **labels: Any) -> None:
    """Write one span that began at `start` (unix seconds) and lasted `seconds`."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = {"span": name, "start": round(start, 6), "s": round(seconds, 6), "problem": _problem.get()}
    line["thread"] = threading.current_thread().name
    line.update(labels)
    with _write_lock, open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line, default=str) + "\n")


@contextlib.contextmanager
def span(name: str, **labels: Any) -> Iterator[None]:
    """Time the block as span `name` (nothing is timed when tracing is off)."""
    if not tracing():
        yield
        return
    start, began = time.time(), time.perf_counter()
    try:
        yield
    finally:
        record(name, start, time.perf_counter() - began, **labels)


def read(path: str | Path) -> list[dict[str, Any]]:
    """The spans of a trace file; a line cut short by a killed run is skipped."""
    spans = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            spans.append(json.loads(line))
    return spans


def summary(spans: list[dict[str, Any]], wall_s: float | None = None) -> str:
    """Seconds by span (and mode), with counts and means; with `wall_s`, each total's share of it
    (the GPU slot's share is how busy the device was kept)."""
    totals: dict[str, list[float]] = {}
    for s in spans:
        key = s["span"] + (f" {s['mode']}" if s.get("mode") else "")
        totals.setdefault(key, []).append(float(s["s"]))
    if wall_s is None and spans:
        wall_s = max(s["start"] + s["s"] for s in spans) - min(s["start"] for s in spans)
    lines = [f"{'span':28s} {'count':>6s} {'total s':>9s} {'mean s':>8s} {'max s':>8s} {'of wall':>8s}"]
    for key, seconds in sorted(totals.items(), key=lambda item: -sum(item[1])):
        total = sum(seconds)
        share = f"{100 * total / wall_s:7.1f}%" if wall_s else ""
        mean = total / len(seconds)
        lines.append(f"{key:28s} {len(seconds):6d} {total:9.1f} {mean:8.3f} {max(seconds):8.3f} {share}")
    return "\n".join(lines)
