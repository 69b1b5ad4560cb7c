"""`kforge report --html`: one run of the Parquet results as one HTML page, with its plots as PNG files beside it.

The page (template `kforge/templates/report.html.j2`) shows fast_p curves and the fast_p table per level, backend
and model; the distribution of the problems' best correct speedups; the outcome counts; one row per problem with
a link to its best kernel; the run's device and toolchain; and `kforge compare` against the previous run of the
same suite, backend and model. Beside ``report.html`` go ``report_fast_p.png``, ``report_speedups.png``,
``report_outcomes.png`` and ``report_kernels/<problem>.py``. The PNGs are also embedded as data URIs, so the page
needs no other file to show everything but the kernels' sources.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
import numpy as np
import pandas as pd

from kforge import compare, results
from tasks.harness.protocol import OUTCOMES

GROUP_BY = ("level", "backend", "model")
FAST_P_POINTS = tuple(float(p) for p in np.linspace(0.0, 4.0, 41))
TABLE_PS = (0, 1, 1.5, 2)
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
MATPLOTLIB_MISSING = "kforge report --html needs matplotlib: pip install 'kforge[report]'"
_RUN_COLUMNS = ("status", "started_at", "finished_at", "host", "gpu_name", "driver", "torch_version", "python_version")
_ATTEMPT_COLUMNS = ("suite", "backend", "device", "model", "agent", "size_preset")
_QUIET_CHANGES = ("unchanged", "still_failing")  # as `kforge compare`: counted, not listed


class ReportError(Exception):
    """The report cannot be written; the message is one line saying what to do."""


@dataclass(frozen=True)
class ProblemRow:
    """One problem of the run, by its best attempt: the fastest correct one, else the last one."""

    problem_id: str
    level: int | None
    attempts: int
    outcome: str
    error_class: str | None
    speedup: float | None  # the best correct speedup against the report's baseline
    kernel_href: str | None  # the attempt's source, written beside the page (relative link); None without source


@dataclass(frozen=True)
class HtmlReport:
    """What `write_html_report` wrote and the numbers the page shows."""

    page_path: Path
    png_paths: tuple[Path, ...]  # fast_p curves, speedup histogram, outcome counts
    kernel_paths: tuple[Path, ...]
    run_id: str
    baseline: str
    ps: tuple[float, ...]  # the fast_p curves' points
    fast_p: dict[str, tuple[float, ...]]  # group label -> fast_p at each of ps
    summary: dict[str, dict[str, float]]  # group label -> results.report_table's columns (fast_1, geomean_speedup...)
    problems: tuple[ProblemRow, ...]
    best_outcomes: dict[str, int]  # outcome -> problems whose best attempt has it
    all_outcomes: dict[str, int]  # outcome -> attempts
    compared_with: str | None  # the earlier run of the comparison; None when there is none
    comparison_note: str | None  # why there is no comparison (CompareError's message)

    @property
    def correct_problems(self) -> int:
        return self.best_outcomes.get("correct", 0)


def group_label(key: Any) -> str:
    """A group's key (values of GROUP_BY, in order) -> its label on the page, e.g. 'level=1, backend=cpu, model=-'."""
    values = key if isinstance(key, tuple) else (key,)
    return ", ".join(f"{name}={'-' if pd.isna(value) else value}" for name, value in zip(GROUP_BY, values))


# --- data ---------------------------------------------------------------------------------------------


def _run_attempts(results_dir: Path, run_id: str | None) -> tuple[str, pd.DataFrame]:
    attempts = results.load("attempts", results_dir)
    if attempts.empty:
        raise ReportError(f"no attempts recorded under {results_dir}/attempts (run `kforge run` first)")
    if run_id in (None, "latest"):
        run_id = str(attempts.sort_values("created_at", kind="stable")["run_id"].iloc[-1])
    of_run = attempts[attempts["run_id"] == run_id]
    if of_run.empty:
        raise ReportError(
            f"no attempts of run {run_id!r} under {results_dir}/attempts; "
            f"list runs with `kforge report --results {results_dir} --by run_id`"
        )
    return run_id, of_run.reset_index(drop=True)


def _fast_p_curves(attempts: pd.DataFrame, baseline: str) -> dict[str, tuple[float, ...]]:
    by_p = results.fast_p_curve(attempts, FAST_P_POINTS, by=GROUP_BY, baseline=baseline)
    # Every Series has the same groups in the same order; by position, since a label lookup with a null key misses.
    curves = {group_label(key): tuple(float(s.iloc[i]) for s in by_p) for i, key in enumerate(by_p[0].index)}
    if len(curves) > 1:
        curves["all problems"] = tuple(map(float, results.fast_p_curve(attempts, FAST_P_POINTS, baseline=baseline)))
    return curves


def _summary(attempts: pd.DataFrame, baseline: str, with_total: bool) -> dict[str, dict[str, float]]:
    table = results.report_table(attempts, ps=TABLE_PS, by=GROUP_BY, baseline=baseline)
    numbers = [c for c in table.columns if c not in GROUP_BY]
    summary = {group_label(tuple(row[list(GROUP_BY)])): _plain(row[numbers]) for _, row in table.iterrows()}
    if with_total:
        total = results.report_table(attempts, ps=TABLE_PS, by=(), baseline=baseline)
        summary["all problems"] = _plain(total.iloc[0])
    return summary


def _plain(row: pd.Series) -> dict[str, float]:
    return {name: (int(value) if name in ("problems", "correct") else float(value)) for name, value in row.items()}


def _best_attempts(attempts: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One attempt per problem: the correct one with the highest speedup (a correct attempt without a speedup
    ranks below those with one), else the last one -- kforge.compare's rule, for the report's baseline."""
    is_correct = attempts["outcome"].eq("correct").fillna(False).astype(bool)
    speedup = pd.to_numeric(attempts[f"speedup_{baseline}"], errors="coerce").astype("float64")
    ranked = attempts.assign(_correct=is_correct, _rank=speedup.where(is_correct).fillna(-np.inf))
    ranked = ranked.sort_values(["_correct", "_rank", "created_at"], kind="stable")
    return ranked.drop_duplicates("problem_id", keep="last").sort_values(["level", "problem_id"], kind="stable")


def _kernel_file_name(problem_id: str, taken: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", problem_id).strip("._") or "problem"
    if name in taken:  # two ids that differ only in characters a file name cannot hold
        name = f"{name}-{hashlib.sha256(problem_id.encode()).hexdigest()[:8]}"
    taken.add(name)
    return f"{name}.py"


def _problem_rows(attempts: pd.DataFrame, baseline: str, kernels_dir: Path) -> tuple[list[ProblemRow], dict[Path, str]]:
    """The per-problem table and the kernel files to write (path -> source)."""
    best_speedups = results.best_per_problem(attempts, by=[], baseline=baseline).set_index("problem_id")
    counts = attempts.groupby("problem_id").size()
    rows, kernels, taken = [], {}, set()
    for _, attempt in _best_attempts(attempts, baseline).iterrows():
        problem_id = str(attempt["problem_id"])
        source, href = attempt["candidate_source"], None
        if isinstance(source, str) and source:
            name = _kernel_file_name(problem_id, taken)
            kernels[kernels_dir / name] = source
            href = quote(f"{kernels_dir.name}/{name}")
        speedup = best_speedups.loc[problem_id, f"speedup_{baseline}"]
        rows.append(
            ProblemRow(
                problem_id=problem_id,
                level=None if pd.isna(attempt["level"]) else int(attempt["level"]),
                attempts=int(counts[problem_id]),
                outcome=str(attempt["outcome"]),
                error_class=None if pd.isna(attempt["error_class"]) else str(attempt["error_class"]),
                speedup=None if pd.isna(speedup) else float(speedup),
                kernel_href=href,
            )
        )
    return rows, kernels


def _outcome_counts(outcomes: pd.Series) -> dict[str, int]:
    found = Counter(outcomes.astype(str))
    return {outcome: found.get(outcome, 0) for outcome in OUTCOMES}


def _when(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else pd.Timestamp(value).strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def _run_facts(results_dir: Path, run_id: str, attempts: pd.DataFrame) -> tuple[list[tuple[str, str]], str | None]:
    """(label, value) pairs of the run's setting, device and toolchain, and its config as indented JSON."""
    facts = [("run id", run_id), ("attempts", str(len(attempts)))]
    for column in _ATTEMPT_COLUMNS:
        values = sorted(attempts[column].dropna().astype(str).unique())
        if values:
            facts.append((column, ", ".join(values)))
    runs = results.load("runs", results_dir)
    run = runs[runs["run_id"] == run_id]
    if run.empty:
        return facts, None
    run = run.iloc[-1]
    for column in _RUN_COLUMNS:
        value = _when(run[column]) if column.endswith("_at") else run[column]
        if value is not None and not pd.isna(value):
            facts.append((column.replace("_", " "), str(value)))
    for key, value in sorted(_json_dict(run["toolchain"]).items()):
        if value not in (None, ""):
            facts.append((f"toolchain {key}", str(value)))
    if not pd.isna(run["git_sha"]):
        facts.append(("git sha", str(run["git_sha"])))
    config = _json_dict(run["config"])
    return facts, json.dumps(config, indent=2, sort_keys=True) if config else None


def _json_dict(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _comparison(results_dir: Path, run_id: str) -> tuple[compare.Comparison | None, str | None]:
    try:
        return compare.compare_runs(results_dir, run_b=run_id), None
    except compare.CompareError as exc:
        return None, str(exc)


def _listed_changes(comparison: compare.Comparison) -> list[compare.ProblemChange]:
    order = {change: index for index, change in enumerate(compare.CHANGES)}
    listed = [p for p in comparison.problems if p.change not in _QUIET_CHANGES]
    return sorted(listed, key=lambda p: (order[p.change], p.problem_id))


# --- plots ---------------------------------------------------------------------------------------------


def _require_matplotlib() -> None:
    """Fail before any work when the `report` extra is not installed."""
    try:
        for module in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
            importlib.import_module(module)
    except ImportError as exc:
        raise ReportError(MATPLOTLIB_MISSING) from exc


def _new_figure(width: float, height: float) -> tuple[Any, Any]:
    """A matplotlib Figure on an Agg canvas (no pyplot: no global backend state) and its one Axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.subplots()


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _fast_p_png(curves: dict[str, tuple[float, ...]], baseline: str) -> bytes:
    figure, axes = _new_figure(8.0, 4.2)
    for label, values in curves.items():
        style = {"color": "black", "linestyle": "--"} if label == "all problems" else {}
        axes.plot(FAST_P_POINTS, values, drawstyle="steps-post", marker=".", label=label, **style)
    axes.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    axes.set(xlim=(0, 4), ylim=(-0.02, 1.02), xlabel=f"p (speedup vs {baseline} above p)", ylabel="fast_p")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="upper right")
    return _png(figure)


def _speedups_png(speedups: np.ndarray, baseline: str) -> bytes:
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    figure, axes = _new_figure(8.0, 3.4)
    if len(speedups):
        low, high = min(speedups.min(), 0.5), max(speedups.max(), 2.0)  # keeps the 1x line in view
        axes.hist(speedups, bins=np.geomspace(low / 1.1, high * 1.1, 25), color="#4878a8", edgecolor="white")
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_locator(LogLocator(base=2))
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    else:
        axes.text(0.5, 0.5, "no correct problem", transform=axes.transAxes, ha="center", va="center")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set(xlabel=f"best correct speedup per problem vs {baseline} (log scale)", ylabel="problems")
    return _png(figure)


def _outcomes_png(best_outcomes: dict[str, int], all_outcomes: dict[str, int]) -> bytes:
    from matplotlib.ticker import MaxNLocator

    figure, axes = _new_figure(8.0, 3.6)
    positions = np.arange(len(OUTCOMES))
    series = (("problems (by best attempt)", best_outcomes), ("attempts", all_outcomes))
    for offset, (label, counts) in zip((-0.2, 0.2), series):
        values = [counts[outcome] for outcome in OUTCOMES]
        bars = axes.barh(positions + offset, values, height=0.4, label=label)
        axes.bar_label(bars, labels=[str(v) if v else "" for v in values], fontsize="small", padding=2)
    axes.set_yticks(positions, OUTCOMES)
    axes.invert_yaxis()
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("count")
    figure.legend(loc="outside upper center", ncols=2, fontsize="small", frameon=False)
    return _png(figure)


# --- page ----------------------------------------------------------------------------------------------


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=True, undefined=jinja2.StrictUndefined
    )
    environment.filters["fraction"] = lambda value: "-" if value is None or np.isnan(value) else f"{value:.3f}"
    environment.filters["speedup"] = lambda value: "-" if value is None or np.isnan(value) else f"{value:.2f}x"
    return environment


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _write(files: dict[Path, str | bytes]) -> None:
    for path, content in files.items():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise ReportError(f"could not write {path}: {exc.strerror or exc}; give --html a writable path") from exc


def write_html_report(
    results_dir: str | Path, out_path: str | Path, run_id: str | None = None, baseline: str = "eager"
) -> HtmlReport:
    """Write the page of run ``run_id`` (None or 'latest': the run with the newest attempt) of the results under
    ``results_dir`` to ``out_path``, its PNGs and kernels beside it; speedups are against ``baseline``
    (eager | compile | best). Raises ReportError (one line) for no such run or a missing matplotlib."""
    if baseline not in results.BASELINES:
        raise ReportError(f"baseline {baseline!r}: use one of {', '.join(results.BASELINES)}")
    _require_matplotlib()
    results_dir, page_path = Path(results_dir), Path(out_path)
    run_id, attempts = _run_attempts(results_dir, run_id)
    curves = _fast_p_curves(attempts, baseline)
    summary = _summary(attempts, baseline, with_total="all problems" in curves)
    problems, kernels = _problem_rows(attempts, baseline, page_path.with_name(f"{page_path.stem}_kernels"))
    best_outcomes = _outcome_counts(pd.Series([p.outcome for p in problems], dtype="object"))
    all_outcomes = _outcome_counts(attempts["outcome"])
    speedups = np.array([p.speedup for p in problems if p.speedup is not None], dtype=float)
    speedups = speedups[np.isfinite(speedups) & (speedups > 0)]  # a log axis
    pngs = {
        page_path.with_name(f"{page_path.stem}_fast_p.png"): _fast_p_png(curves, baseline),
        page_path.with_name(f"{page_path.stem}_speedups.png"): _speedups_png(speedups, baseline),
        page_path.with_name(f"{page_path.stem}_outcomes.png"): _outcomes_png(best_outcomes, all_outcomes),
    }
    facts, config_json = _run_facts(results_dir, run_id, attempts)
    comparison, comparison_note = _comparison(results_dir, run_id)
    page = (
        _environment()
        .get_template("report.html.j2")
        .render(
            run_id=run_id,
            baseline=baseline,
            summary=summary,
            table_columns=[f"fast_{p:g}" for p in TABLE_PS],
            images=dict(zip(("fast_p", "speedups", "outcomes"), map(_data_uri, pngs.values()))),
            problems=problems,
            outcomes=OUTCOMES,
            best_outcomes=best_outcomes,
            all_outcomes=all_outcomes,
            facts=facts,
            config_json=config_json,
            comparison=comparison,
            comparison_note=comparison_note,
            changes=_listed_changes(comparison) if comparison else [],
            regression_changes=compare.REGRESSION_CHANGES,
            improvement_changes=compare.IMPROVEMENT_CHANGES,
        )
    )
    _write({**pngs, **kernels, page_path: page})
    return HtmlReport(
        page_path=page_path,
        png_paths=tuple(pngs),
        kernel_paths=tuple(kernels),
        run_id=run_id,
        baseline=baseline,
        ps=FAST_P_POINTS,
        fast_p=curves,
        summary=summary,
        problems=tuple(problems),
        best_outcomes=best_outcomes,
        all_outcomes=all_outcomes,
        compared_with=comparison.run_a.run_id if comparison else None,
        comparison_note=comparison_note,
    )
