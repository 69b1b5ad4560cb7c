"""What a suite run shows in the Prefect UI: its attempts as a table artifact, and its summary with
the comparison against the previous run of the same suite, backend and model as a markdown artifact.
So "what happened last night" is answered in the UI without opening Parquet."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from kforge import results
from kforge.compare import CompareError, compare_runs, comparison_markdown
from kforge.config import RunConfig

TABLE_COLUMNS = (*results.SUMMARY_COLUMNS, "timing_source")


def artifact_key(config: RunConfig, kind: str) -> str:
    """`kforge-<suite>-<backend>-<kind>`: the same key every night, so the UI keeps the history."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{Path(config.suite).name or config.suite}-{config.backend}".lower())
    return f"kforge-{slug.strip('-')}-{kind}"


def _cell(value: Any) -> Any:
    """A JSON-ready cell: None for missing values, plain Python numbers, floats rounded."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    value = value.item() if hasattr(value, "item") else value  # numpy scalars
    return round(value, 4) if isinstance(value, float) else value


def attempt_table(run_id: str, results_dir: str) -> list[dict[str, Any]]:
    """The run's attempts (superseded rows dropped), one dict each, in problem and iteration order."""
    attempts = results.load("attempts", results_dir)
    if attempts.empty:
        return []
    mine = attempts[attempts["run_id"] == run_id].sort_values(["problem_id", "iteration"])
    return [{column: _cell(row[column]) for column in TABLE_COLUMNS} for _, row in mine.iterrows()]


def summary_markdown(summary: dict[str, Any], comparison: str) -> str:
    outcomes = ", ".join(f"{name} {count}" for name, count in sorted(summary["outcomes"].items())) or "none"
    lines = [f"## kforge run {summary['run_id']}", "", f"{summary['problems']} problems; outcomes: {outcomes}  "]
    if summary.get("failed_problems"):
        failed = ", ".join(summary["failed_problems"])
        lines.append(f"failed (infrastructure, `kforge retry {summary['run_id']}`): {failed}  ")
    if summary.get("broken_problems"):
        lines.append(f"reference fails: {', '.join(summary['broken_problems'])}  ")
    lines += [f"results: `{summary['results_dir']}`", "", comparison]
    return "\n".join(lines)


@task(name="publish", cache_policy=NO_CACHE)
def publish_task(summary: dict[str, Any], config: RunConfig) -> bool:
    """Create the run's two artifacts; True if the comparison with the previous run found regressions."""
    table = attempt_table(summary["run_id"], config.results_dir)
    create_table_artifact(
        table=table or [{"problem_id": None}],
        key=artifact_key(config, "attempts"),
        description=f"attempts of run {summary['run_id']}",
    )
    try:
        comparison = compare_runs(config.results_dir, run_b=summary["run_id"])
    except CompareError as exc:  # the first run of its kind, say
        markdown, regressed = f"No comparison: {exc}", False
    else:
        markdown, regressed = comparison_markdown(comparison), comparison.has_regressions
    create_markdown_artifact(
        markdown=summary_markdown(summary, markdown),
        key=artifact_key(config, "summary"),
        description=f"summary of run {summary['run_id']}",
    )
    return regressed
