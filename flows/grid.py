"""The papers' experiment grid: the same suite under every combination of model, iterations,
cross-platform reference and performance agent, one run-suite each, so fast_p compares across them."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.suite import run_suite
from kforge.config import Backend, RunConfig, grid_configs


@flow(name="run-grid")
def run_grid(
    config: RunConfig,
    models: list[str] | None = None,
    iterations: list[int] | None = None,
    reference_backends: list[Backend | None] | None = None,
    performance_agent: list[bool] | None = None,
) -> list[dict[str, Any]]:
    """Run `config.suite` once per combination; returns each run's summary (or its failure)."""
    summaries = []
    for combination in grid_configs(config, models, iterations, reference_backends, performance_agent):
        state = run_suite(combination, return_state=True)
        if state.is_completed():
            summaries.append(state.result())
        else:
            get_run_logger().error("combination failed: %s", state.message)
            summaries.append({"failed": state.message, "config": combination.model_dump(mode="json")})
    return summaries
