"""The experiment grid: one run per combination, each recorded with its settings, comparable by fast_p."""

import shutil
from pathlib import Path

import pytest

from flows.grid import run_grid
from kforge import results
from kforge.config import RunConfig, grid_configs, grid_plan

SMOKE = Path(__file__).resolve().parents[2] / "data" / "problems" / "smoke"


def test_grid_configs_cover_every_combination_and_keep_the_rest():
    base = RunConfig(suite="s", backend="cpu", correctness_trials=5, llm={"model": "a", "temperature": 0.7})
    combos = grid_configs(base, ["a", "b"], [0, 5], [None, "cuda"], [False, True])
    keys = {(c.llm.model, c.iterations, c.reference_backend, c.performance_agent) for c in combos}
    assert len(combos) == len(keys) == 16
    assert all(c.correctness_trials == 5 and c.llm.temperature == 0.7 and c.agent == "llm" for c in combos)
    assert [c.iterations for c in grid_configs(base, iterations=[0, 3])] == [0, 3]
    assert grid_configs(RunConfig(), iterations=[0])[0].agent == "reference"  # no model: the offline agent
    with pytest.raises(ValueError):
        grid_configs(base, reference_backends=["metal"])


def test_a_performance_agent_or_soft_check_without_a_model_is_skipped_with_a_reason():
    configs, skipped = grid_plan(RunConfig(), iterations=[0, 1], performance_agent=[False, True])
    assert [(c.iterations, c.performance_agent, c.agent) for c in configs] == [
        (0, False, "reference"),
        (1, False, "reference"),
    ]
    assert skipped == [
        f"skipped model=None iterations={n} reference_backend=None performance_agent=on: "
        "the performance agent needs a model (give --models NAME)"
        for n in (0, 1)
    ]
    assert (
        grid_configs(RunConfig(), performance_agent=[False, True])
        == grid_plan(RunConfig(), performance_agent=[False, True])[0]
    )

    with_model, none_skipped = grid_plan(RunConfig(), models=["m"], performance_agent=[False, True])
    assert [c.performance_agent for c in with_model] == [False, True] and none_skipped == []

    soft = RunConfig(soft_check=True)
    assert grid_plan(soft, performance_agent=[False, True]) == (
        [],
        [
            "skipped model=None iterations=1 reference_backend=None performance_agent=off: "
            "the soft check needs a model (give --models NAME)",
            "skipped model=None iterations=1 reference_backend=None performance_agent=on: "
            "the performance agent and the soft check need a model (give --models NAME)",
        ],
    )


def test_the_grid_flow_never_records_an_agent_that_was_off(prefect_server, config, tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(SMOKE / "1_relu.py", suite / "1_relu.py")
    base = config.model_copy(update={"suite": str(suite), "results_dir": str(tmp_path / "results"), "iterations": 0})

    summaries = run_grid(base, performance_agent=[False, True])

    assert len(summaries) == 1  # the "on" combination cannot run without a model: skipped, not run
    attempts = results.load("attempts", base.results_dir)
    assert attempts["performance_agent"].tolist() == [False]
    runs = results.load("runs", base.results_dir)
    assert [RunConfig.model_validate_json(c).performance_agent for c in runs["config"]] == [False]


def test_single_shot_against_refinement_through_the_grid_flow(prefect_server, config, tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(SMOKE / "1_relu.py", suite / "1_relu.py")  # its first offline proposal does not compile
    base = config.model_copy(update={"suite": str(suite), "results_dir": str(tmp_path / "results")})

    summaries = run_grid(base, iterations=[0, 1])

    assert [s["outcomes"] for s in summaries] == [{"compile_error": 1}, {"compile_error": 1, "correct": 1}]
    attempts = results.load("attempts", base.results_dir)
    assert attempts["run_id"].nunique() == 2
    by_iterations = results.fast_p(attempts, 0, by=["max_iterations"])
    assert by_iterations.to_dict() == {0: 0.0, 1: 1.0}
    runs = results.load("runs", base.results_dir)
    assert sorted(RunConfig.model_validate_json(c).iterations for c in runs["config"]) == [0, 1]
