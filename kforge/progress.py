"""`kforge run`'s progress: a bar on a terminal, one plain line per problem elsewhere (logs, CI, cron).

The suite flow reports each finished problem to the reporter `kforge run` installed (`reporting`);
a flow started another way (a deployment, the UI's Retry) has none and reports nothing here: its
Prefect log has the same facts.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

BAR_WIDTH = 24


@dataclass
class Progress:
    total: int
    stream: TextIO
    on_terminal: bool
    done: int = 0
    correct: int = 0
    best_speedup: float | None = None
    started: float = field(default_factory=time.monotonic)

    def problem_done(self, problem_id: str, rows: list[dict[str, Any]]) -> None:
        """Count one finished problem (its attempts' rows; none if it failed or was skipped)."""
        self.done += 1
        correct = [row for row in rows if row.get("outcome") == "correct"]
        self.correct += bool(correct)
        speedups = [row["speedup_eager"] for row in correct if _finite(row.get("speedup_eager"))]
        if speedups:
            self.best_speedup = max([*speedups, self.best_speedup or 0.0])
        if self.on_terminal:
            end = "\n" if self.done == self.total else ""
            self.stream.write("\r" + self.bar_line() + end)
        else:
            outcome = rows[-1]["outcome"] if rows else "no attempt"
            best = f" {max(speedups):.2f}x" if speedups else ""
            self.stream.write(f"{self.done}/{self.total} {problem_id}: {outcome}{best} ({self.times()})\n")
        self.stream.flush()

    def bar_line(self) -> str:
        filled = BAR_WIDTH * self.done // max(self.total, 1)
        best = f"{self.best_speedup:.2f}x" if self.best_speedup is not None else "-"
        return (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} problems, "
            f"{self.correct} correct, best {best}, {self.times()}"
        )

    def times(self) -> str:
        """Elapsed, and the rest estimated at the mean time per problem so far."""
        elapsed = time.monotonic() - self.started
        if not self.done or self.done >= self.total:
            return f"{_clock(elapsed)} elapsed"
        left = elapsed / self.done * (self.total - self.done)
        return f"{_clock(elapsed)} elapsed, ~{_clock(left)} left"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("kforge_progress", default=None)


@contextlib.contextmanager
def reporting(stream: TextIO | None = None) -> Iterator[None]:
    """Within this block the suite flow reports to `stream` (default stderr: stdout keeps the table)."""
    stream = stream or sys.stderr
    token = _current.set(Progress(0, stream, on_terminal=stream.isatty()))
    try:
        yield
    finally:
        _current.reset(token)


def start(total: int) -> Progress | None:
    """The reporter of this `kforge run`, counting `total` problems from now; None outside `reporting`."""
    progress = _current.get()
    if progress is not None:
        progress.total, progress.done, progress.correct, progress.best_speedup = total, 0, 0, None
        progress.started = time.monotonic()
    return progress
