"""Regression detection: one recorded run against another, problem by problem.

``compare_runs(results_dir, run_a=None, run_b=None)`` pairs two runs of the Parquet results (kforge.results),
takes each run's best attempt per problem and sorts every problem into one change class:

- ``new_failure``: correct in A, failing in B (with B's outcome class) -- a regression;
- ``slower``: correct in both, B's speedup lower than A's beyond the measured noise -- a regression;
- ``within_noise``: correct in both, B's speedup lower but within the noise -- listed, not a regression;
- ``faster``: correct in both, B's speedup higher beyond the noise -- an improvement;
- ``fixed``: failing in A, correct in B -- an improvement;
- ``unmeasured``: correct in both with different speedups, but a run lacks the p10/p90 (or speedup) to judge
  the noise -- listed, not a regression;
- ``unchanged``, ``still_failing``, ``only_a``, ``only_b`` (the problem was attempted in one run only).

Best attempt per problem and run: among its correct attempts the one with the highest ``speedup_best``
(a correct attempt without a speedup ranks below those with one); with no correct attempt, the last attempt
(by ``created_at``), whose outcome is the problem's outcome in that run.

Noise rule (no fixed percentage): each run's speedup of a problem gets the interval its own recorded timing
spread gives it. The speedup is baseline_ms / runtime_ms with runtime_ms the median, so with the
same baseline the candidate's p90 and p10 times give the interval

    [speedup_best * runtime_ms / runtime_p90_ms,  speedup_best * runtime_ms / runtime_p10_ms]

B is ``slower`` when its interval lies entirely below A's (B's upper end < A's lower end), ``faster`` when it
lies entirely above, and a drop with overlapping intervals is ``within_noise``. When both runs timed against
the same baseline this is exactly "B's runtime p10 is above A's runtime p90"; scaling by the speedup also
catches a drop that comes from a changed baseline. The baseline's own spread is not recorded and not counted.

Default pairing: B is the latest run (by ``started_at``) whose last ``runs`` row is ``finished``; A is the
latest finished run started before B with the same suite, backend and model. Only ``run_b``: A is found the
same way. A run's suite, backend and model are the most common values of its attempts' columns, else
those of its recorded config.

Bad input (unknown run ids, no previous run, no results) raises ``CompareError`` with a one-line message.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kforge import results

REGRESSION_CHANGES = ("new_failure", "slower")
IMPROVEMENT_CHANGES = ("fixed", "faster")
CHANGES = (
    "new_failure",
    "slower",
    "within_noise",
    "unmeasured",
    "fixed",
    "faster",
    "unchanged",
    "still_failing",
    "only_a",
    "only_b",
)
_LISTED = ("new_failure", "slower", "within_noise", "unmeasured", "fixed", "faster", "only_a", "only_b")
_LABELS = {
    "new_failure": "new failure",
    "slower": "slower",
    "within_noise": "within noise",
    "unmeasured": "noise unknown",
    "fixed": "fixed",
    "faster": "faster",
    "only_a": "only in A",
    "only_b": "only in B",
}
_LIST_RUNS = "list runs with `kforge report --results {dir} --by run_id`"


class CompareError(ValueError):
    """The runs to compare cannot be found or paired; the message is one line naming what to do."""


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    status: str | None  # the run's last status in `runs` (None: no runs row)
    started_at: pd.Timestamp | None
    suite: str | None
    backend: str | None
    model: str | None

    @property
    def identity(self) -> tuple[str | None, str | None, str | None]:
        return (self.suite, self.backend, self.model)


@dataclass(frozen=True)
class ProblemResult:
    """One run's best attempt at one problem."""

    outcome: str
    speedup: float | None  # speedup_best of a correct attempt
    runtime_ms: float | None
    runtime_p10_ms: float | None
    runtime_p90_ms: float | None

    @property
    def correct(self) -> bool:
        return self.outcome == "correct"

    @property
    def interval(self) -> tuple[float, float] | None:
        """The speedup's noise interval (see the module docstring), or None when it cannot be computed."""
        values = (self.speedup, self.runtime_ms, self.runtime_p10_ms, self.runtime_p90_ms)
        if not self.correct or any(v is None or not math.isfinite(v) or v <= 0 for v in values):
            return None
        speedup, median, p10, p90 = values
        if p10 > p90:
            return None
        return (speedup * median / p90, speedup * median / p10)


@dataclass(frozen=True)
class ProblemChange:
    problem_id: str
    change: str  # one of CHANGES
    a: ProblemResult | None
    b: ProblemResult | None


@dataclass(frozen=True)
class Comparison:
    results_dir: str
    run_a: RunInfo
    run_b: RunInfo
    problems: tuple[ProblemChange, ...] = field(default_factory=tuple)

    def of(self, *changes: str) -> list[ProblemChange]:
        return [p for p in self.problems if p.change in changes]

    @property
    def new_failures(self) -> list[ProblemChange]:
        return self.of("new_failure")

    @property
    def slower(self) -> list[ProblemChange]:
        return self.of("slower")

    @property
    def within_noise(self) -> list[ProblemChange]:
        return self.of("within_noise")

    @property
    def regressions(self) -> list[ProblemChange]:
        return self.of(*REGRESSION_CHANGES)

    @property
    def improvements(self) -> list[ProblemChange]:
        return self.of(*IMPROVEMENT_CHANGES)

    @property
    def new_failures_by_outcome(self) -> dict[str, int]:
        return dict(sorted(Counter(p.b.outcome for p in self.new_failures).items()))

    @property
    def counts(self) -> dict[str, int]:
        found = Counter(p.change for p in self.problems)
        return {change: found.get(change, 0) for change in CHANGES}

    @property
    def has_regressions(self) -> bool:
        return bool(self.regressions)

    @property
    def exit_code(self) -> int:
        return 1 if self.has_regressions else 0


# --- pairing -----------------------------------------------------------------------------------------


def _mode(values: pd.Series) -> str | None:
    values = values.dropna()
    return None if values.empty else str(values.astype(str).value_counts().index[0])


def _from_config(config: Any) -> dict[str, str | None]:
    try:
        settings = json.loads(config) if isinstance(config, str) else {}
    except ValueError:
        settings = {}
    if not isinstance(settings, dict):
        settings = {}
    llm = settings.get("llm") if isinstance(settings.get("llm"), dict) else {}
    suite = settings.get("suite")
    return {
        "suite": Path(str(suite)).name if suite else None,
        "backend": settings.get("backend"),
        "model": llm.get("model") or settings.get("model"),
    }


def _run_infos(runs: pd.DataFrame, attempts: pd.DataFrame) -> dict[str, RunInfo]:
    infos: dict[str, RunInfo] = {}
    by_run = dict(tuple(attempts.groupby("run_id", sort=False))) if not attempts.empty else {}
    run_rows = {row["run_id"]: row for _, row in runs.iterrows()}
    for run_id in list(dict.fromkeys([*run_rows, *by_run])):
        row = run_rows.get(run_id)
        fallback = _from_config(row["config"]) if row is not None else {}
        rows = by_run.get(run_id)
        ident = {
            key: (_mode(rows[key]) if rows is not None else None) or fallback.get(key)
            for key in ("suite", "backend", "model")
        }
        started = row["started_at"] if row is not None else None
        if (started is None or pd.isna(started)) and rows is not None:
            started = rows["created_at"].min()
        infos[run_id] = RunInfo(
            run_id=run_id,
            status=row["status"] if row is not None else None,
            started_at=None if started is None or pd.isna(started) else started,
            **ident,
        )
    return infos


def _order(info: RunInfo) -> tuple[bool, pd.Timestamp]:
    return (info.started_at is not None, info.started_at or pd.Timestamp.min.tz_localize("UTC"))


def _describe(info: RunInfo) -> str:
    return f"suite {info.suite}, backend {info.backend}, model {info.model}"


def _pick_runs(
    results_dir: str, infos: dict[str, RunInfo], run_a: str | None, run_b: str | None
) -> tuple[RunInfo, RunInfo]:
    for run_id in (run_a, run_b):
        if run_id is not None and run_id not in infos:
            raise CompareError(f"unknown run id {run_id!r} under {results_dir}; {_LIST_RUNS.format(dir=results_dir)}")
    if run_a is not None and run_b is None:
        raise CompareError(
            f"RUN_A {run_a!r} needs a RUN_B; name both, or only RUN_B to compare it with its previous run"
        )
    finished = sorted((i for i in infos.values() if i.status == "finished"), key=_order)
    if run_b is None:
        if not finished:
            raise CompareError(f"no finished run under {results_dir}/runs; run `kforge run` first, or name two runs")
        b = finished[-1]
    else:
        b = infos[run_b]
    if run_a is not None:
        return infos[run_a], b
    earlier = [i for i in finished if i.run_id != b.run_id and i.identity == b.identity and _order(i) < _order(b)]
    if not earlier:
        raise CompareError(
            f"no finished run before {b.run_id} with {_describe(b)} under {results_dir}; "
            f"name two runs: kforge compare RUN_A RUN_B ({_LIST_RUNS.format(dir=results_dir)})"
        )
    return earlier[-1], b


# --- per-problem classification ----------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if value is None or pd.isna(value):
        return None
    return float(value)


def _best_attempts(attempts: pd.DataFrame) -> dict[str, ProblemResult]:
    """One run's attempts -> problem_id -> its best attempt (see the module docstring)."""
    best: dict[str, ProblemResult] = {}
    ordered = attempts.sort_values("created_at", kind="stable", na_position="first")
    for problem_id, rows in ordered.groupby("problem_id", sort=True):
        correct = rows[rows["outcome"] == "correct"]
        if not correct.empty:
            speedups = pd.to_numeric(correct["speedup_best"], errors="coerce")
            row = correct.loc[speedups.idxmax()] if speedups.notna().any() else correct.iloc[-1]
        else:
            row = rows.iloc[-1]
        best[str(problem_id)] = ProblemResult(
            outcome=str(row["outcome"]),
            speedup=_number(row["speedup_best"]) if row["outcome"] == "correct" else None,
            runtime_ms=_number(row["runtime_ms"]),
            runtime_p10_ms=_number(row["runtime_p10_ms"]),
            runtime_p90_ms=_number(row["runtime_p90_ms"]),
        )
    return best


def classify(a: ProblemResult | None, b: ProblemResult | None) -> str:
    """The change class (one of CHANGES) of one problem from run A's best attempt to run B's."""
    if b is None:
        return "only_a"
    if a is None:
        return "only_b"
    if a.correct and not b.correct:
        return "new_failure"
    if not a.correct:
        return "fixed" if b.correct else "still_failing"
    if a.speedup == b.speedup:
        return "unchanged"
    interval_a, interval_b = a.interval, b.interval
    if interval_a is None or interval_b is None:
        return "unmeasured"
    if interval_b[1] < interval_a[0]:
        return "slower"
    if interval_b[0] > interval_a[1]:
        return "faster"
    return "within_noise" if b.speedup < a.speedup else "unchanged"


def compare_runs(results_dir: str | Path, run_a: str | None = None, run_b: str | None = None) -> Comparison:
    """Compare run B with run A (default: the latest finished run with the previous finished run of the
    same suite, backend and model). Raises CompareError (one line) for unknown or unpairable runs."""
    results_dir = str(results_dir)
    attempts = results.load("attempts", results_dir)
    runs = results.load("runs", results_dir)
    if attempts.empty and runs.empty:
        raise CompareError(f"no results under {results_dir} (run `kforge run` first, or pass --results DIR)")
    infos = _run_infos(runs, attempts)
    a, b = _pick_runs(results_dir, infos, run_a, run_b)
    if a.run_id == b.run_id:
        raise CompareError(f"RUN_A and RUN_B are both {a.run_id!r}; name two different runs")
    best_a = _best_attempts(attempts[attempts["run_id"] == a.run_id])
    best_b = _best_attempts(attempts[attempts["run_id"] == b.run_id])
    changes = tuple(
        ProblemChange(pid, classify(best_a.get(pid), best_b.get(pid)), best_a.get(pid), best_b.get(pid))
        for pid in sorted(set(best_a) | set(best_b))
    )
    return Comparison(results_dir=results_dir, run_a=a, run_b=b, problems=changes)


# --- rendering ---------------------------------------------------------------------------------------


def _cell(result: ProblemResult | None) -> tuple[str, str]:
    """(outcome or speedup, noise interval) of one side."""
    if result is None:
        return ("-", "")
    if not result.correct:
        return (result.outcome, "")
    speedup = "correct" if result.speedup is None else f"{result.speedup:.2f}x"
    interval = result.interval
    return (speedup, "" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}")


def _rows(result: Comparison) -> list[list[str]]:
    rows = []
    for change in _LISTED:
        for item in result.of(change):
            a, a_noise = _cell(item.a)
            b, b_noise = _cell(item.b)
            rows.append([_LABELS[change], item.problem_id, a, a_noise, b, b_noise])
    return rows


def _summary(result: Comparison) -> str:
    counts = result.counts
    failures = ", ".join(f"{outcome} {n}" for outcome, n in result.new_failures_by_outcome.items())
    parts = [
        f"{len(result.regressions)} regression(s): {counts['new_failure']} new failure(s)"
        + (f" ({failures})" if failures else "")
        + f", {counts['slower']} slower beyond noise",
        f"{counts['within_noise']} drop(s) within noise",
        f"{len(result.improvements)} improvement(s): {counts['fixed']} fixed, {counts['faster']} faster",
        f"{counts['unchanged'] + counts['still_failing']} unchanged",
    ]
    if counts["unmeasured"]:
        parts.append(f"{counts['unmeasured']} without noise data")
    return "; ".join(parts)


def _header(result: Comparison) -> list[str]:
    a, b = result.run_a, result.run_b
    lines = [f"A {a.run_id} -> B {b.run_id}  ({_describe(b)})"]
    differs = [key for key, x, y in zip(("suite", "backend", "model"), a.identity, b.identity) if x != y]
    if differs:
        lines.append(
            "note: the runs differ in " + ", ".join(f"{k} ({getattr(a, k)} vs {getattr(b, k)})" for k in differs)
        )
    return lines


_COLUMNS = ["change", "problem", "A", "A noise", "B", "B noise"]


def comparison_text(result: Comparison) -> str:
    """A short plain-text table of the comparison."""
    lines = [*_header(result), _summary(result)]
    rows = _rows(result)
    if rows:
        widths = [max(len(r[i]) for r in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]
        for row in [_COLUMNS, *rows]:
            lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    lines.append("REGRESSED" if result.has_regressions else "no regressions")
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def comparison_markdown(result: Comparison) -> str:
    """The comparison as Markdown (a heading, the summary and one table), e.g. for a Prefect artifact."""
    verdict = "regressed" if result.has_regressions else "no regressions"
    lines = [f"### kforge compare: {verdict}", ""]
    lines += [_md(line) + "  " for line in _header(result)]
    lines += [_md(_summary(result)), ""]
    rows = _rows(result)
    if rows:
        lines.append("| " + " | ".join(_COLUMNS) + " |")
        lines.append("|" + "---|" * len(_COLUMNS))
        lines += ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
