"""run-suite through a real ephemeral Prefect server: results land in Parquet, and a rerun after a
mid-run failure replays finished stages from Prefect's cache instead of recomputing them."""

import contextlib
import json
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from prefect import tags
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterTags,
    TaskRunFilter,
    TaskRunFilterTags,
)
from prefect.client.schemas.sorting import FlowRunSort, TaskRunSort
from tests_flows_helpers import retry_flow_run

from flows import suite as suite_flow
from flows.suite import run_suite
from kforge import results
from tasks import slots

SMOKE = Path(__file__).resolve().parents[2] / "data" / "problems" / "smoke"


def stage_states(tag: str) -> Counter:
    """(stage, state name) counts of the task runs created under `tag`."""
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            task_run_filter=TaskRunFilter(tags=TaskRunFilterTags(all_=[tag])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            limit=200,
        )
    # Stage runs are named `compile 1_relu #0`, the rest keep Prefect's `load-suite-0c3`.
    return Counter(
        (run.name.split(" ")[0] if " " in run.name else run.name.rsplit("-", 1)[0], run.state.name) for run in task_runs
    )


@pytest.fixture
def small_suite(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("1_relu.py", "1_matmul.py"):  # 1_relu has a compile-error draft first
        # A source of its own: stage results cached by other tests of this session must not count here.
        (suite / name).write_text((SMOKE / name).read_text() + "\n# tests/flows/test_run_suite.py\n")
    (suite / "broken.py").write_text("class Model:\n    pass\n")  # no get_inputs: rejected, not fatal
    return suite


def test_retry_after_failure_replays_finished_stages_from_cache(prefect_server, small_suite, tmp_path, config):
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    blocker = results_dir / "attempts"
    blocker.write_text("a file where the attempts dataset should be: every attempt write fails")
    run_config = config.model_copy(update={"suite": str(small_suite), "results_dir": str(results_dir)})

    with tags("first-try"):
        state = run_suite(run_config, return_state=True)
    assert state.is_failed() and "2 problem(s) failed" in state.message
    first = stage_states("first-try")
    assert first[("compile", "Completed")] == 2  # one candidate per problem reached compile before the failure
    assert first[("record-attempt", "Failed")] == 2
    assert results.load("runs", results_dir)["status"].tolist() == ["failed"]

    blocker.unlink()  # the infrastructure is fixed; the user presses Retry on the failed flow run
    with tags("second-try"):
        retried = retry_flow_run(run_suite, state.state_details.flow_run_id, {"config": run_config})
    assert retried.is_completed(), retried.message
    summary = retried.result()
    second = stage_states("second-try")
    # Everything that finished in the first try is replayed from cache, nothing runs twice; only
    # 1_relu's second candidate (the working kernel, never reached before) is new work.
    assert second[("baseline", "Cached")] == 2 and second[("baseline", "Completed")] == 0
    assert second[("generate", "Cached")] == 2 and second[("generate", "Completed")] == 1
    assert second[("compile", "Cached")] == 2 and second[("compile", "Completed")] == 1
    assert second[("verify", "Cached")] == 1 and second[("verify", "Completed")] == 1
    assert second[("time", "Cached")] == 1 and second[("time", "Completed")] == 1
    assert summary["outcomes"] == {"compile_error": 1, "correct": 2}
    assert summary["rejected_files"] and "broken.py" in summary["rejected_files"][0]

    attempts = results.load("attempts", results_dir)
    assert set(attempts["run_id"]) == {str(state.state_details.flow_run_id)}  # the same run, continued
    assert sorted(zip(attempts["problem_id"], attempts["iteration"], attempts["outcome"])) == [
        ("1_matmul", 0, "correct"),
        ("1_relu", 0, "compile_error"),
        ("1_relu", 1, "correct"),
    ]
    correct = attempts[attempts["outcome"] == "correct"]
    assert (correct["runtime_ms"] > 0).all() and (correct["eager_ms"] > 0).all()
    assert (correct["speedup_eager"] - correct["eager_ms"] / correct["runtime_ms"]).abs().max() < 1e-9
    runs = results.load("runs", results_dir)
    assert runs["status"].tolist() == ["finished"]  # the run's final row supersedes its failed one

    # A second retry of the finished run writes no row twice: every record is a cache hit.
    with tags("third-try"):
        assert retry_flow_run(run_suite, state.state_details.flow_run_id, {"config": run_config}).is_completed()
    third = stage_states("third-try")
    assert third[("record-attempt", "Cached")] == 3 and third[("record-attempt", "Completed")] == 0
    assert len(results.load("attempts", results_dir)) == 3


def test_problem_without_kernel_and_broken_reference(prefect_server, tmp_path, config):
    suite = tmp_path / "suite"
    suite.mkdir()
    # A valid problem the offline agent has no kernel for, as for any KernelBench problem.
    (suite / "7_no_kernel.py").write_text((SMOKE / "1_relu.py").read_text())
    # A problem whose own reference fails; named like a smoke problem so the agent offers a kernel.
    broken = (SMOKE / "1_relu.py").read_text().replace("return torch.relu(x)", "raise ValueError('bad reference')")
    assert "bad reference" in broken
    (suite / "1_relu.py").write_text(broken)
    results_dir = tmp_path / "results"
    summary = run_suite(config.model_copy(update={"suite": str(suite), "results_dir": str(results_dir)}))

    assert summary["broken_problems"] == ["1_relu"]
    assert summary["outcomes"] == {"generation_failed": 1}
    attempts = results.load("attempts", results_dir)
    row = attempts.iloc[0]
    assert (row["problem_id"], row["outcome"], row["error_class"]) == ("7_no_kernel", "generation_failed", "no_code")
    assert "no reference kernel for 7_no_kernel" in row["error_excerpt"]
    assert pd.isna(row["eager_ms"])  # nothing to compare: the reference was never timed


def test_parallel_problems_overlap_and_timing_runs_alone(prefect_server, tmp_path, config, monkeypatch):
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("1_gelu", "1_matmul"):  # CPU kernels without drafts: one correct candidate each
        (suite / f"{name}.py").write_text((SMOKE / f"{name}.py").read_text() + "\n# parallel problems\n")
    held = []  # (mode, entered, left) of every worker stage while it held its device slot
    device_slot = slots.device_slot

    @contextlib.contextmanager
    def recorded_slot(backend, mode, gpu=0):
        with device_slot(backend, mode, gpu):
            entered = time.monotonic()
            try:
                yield
            finally:
                held.append((mode, entered, time.monotonic()))

    monkeypatch.setattr(slots, "device_slot", recorded_slot)
    # how many problems' subflows are in flight at once (not wall-clock overlap, which a busy machine can defeat)
    in_flight, most_in_flight, lock = [0], [0], threading.Lock()
    synthesize = suite_flow.synthesize_problem

    def counted(*args, **kwargs):
        with lock:
            in_flight[0] += 1
            most_in_flight[0] = max(most_in_flight[0], in_flight[0])
        try:
            return synthesize(*args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(suite_flow, "synthesize_problem", counted)
    results_dir = tmp_path / "results"
    run_config = config.model_copy(
        update={"suite": str(suite), "results_dir": str(results_dir), "iterations": 0, "parallel_problems": 2}
    )
    with tags("parallel-problems"):
        summary = run_suite(run_config)

    assert summary["outcomes"] == {"correct": 2} and not summary["failed_problems"]
    with get_client(sync_client=True) as client:
        subflows = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["synthesize-problem"])),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=["parallel-problems"])),
            sort=FlowRunSort.START_TIME_ASC,
            limit=10,
        )
    assert sorted(run.name for run in subflows) == ["1_gelu", "1_matmul"]
    assert most_in_flight[0] == 2  # both problems were in flight at once

    attempts = results.load("attempts", results_dir)
    assert sorted(zip(attempts["problem_id"], attempts["outcome"])) == [
        ("1_gelu", "correct"),
        ("1_matmul", "correct"),
    ]
    assert (attempts["runtime_ms"] > 0).all() and (attempts["eager_ms"] > 0).all()
    # On the cpu backend nothing else holds a worker while a candidate or a baseline is timed.
    timed = [stage for stage in held if stage[0] in slots.TIMING_MODES]
    assert len(timed) == 4  # a baseline and a candidate per problem
    for stage in timed:
        beside = [other for other in held if other is not stage and other[1] < stage[2] and stage[1] < other[2]]
        # the reference timed call for call beside a candidate lives inside the candidate's time stage
        own_pair = [
            o
            for o in beside
            if stage[0] == "time" and o[0] == slots.PAIRED_MODE and stage[1] <= o[1] <= o[2] <= stage[2]
        ]
        assert len(own_pair) == (stage[0] == "time"), f"{stage[0]}: the paired reference beside it: {own_pair}"
        others = [o for o in beside if o not in own_pair]
        assert not others, f"{stage[0]} shared the cores with {others}"


def test_each_run_publishes_its_attempts_and_its_comparison_as_artifacts(prefect_server, tmp_path, config):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    from tasks.publish import artifact_key

    suite = tmp_path / "artifact-night"  # a suite name of its own: the artifact keys are per suite name
    suite.mkdir()
    (suite / "1_gelu.py").write_text((SMOKE / "1_gelu.py").read_text() + "\n# artifacts\n")
    run_config = config.model_copy(
        update={"suite": str(suite), "results_dir": str(tmp_path / "results"), "iterations": 0}
    )
    first, second = run_suite(run_config), run_suite(run_config)

    assert first["regressed"] is False and second["regressed"] in (True, False)

    def artifacts(kind: str) -> list:
        # every field given, as a strict server wants them (FastAPI 0.151-0.154 refused the nulls; see pyproject)
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(run_config, kind)])),
            flow_run_filter=FlowRunFilter(),
            task_run_filter=TaskRunFilter(),
            sort=ArtifactSort.CREATED_DESC,
            limit=10,
            offset=0,
        )

    with get_client(sync_client=True) as client:
        tables, summaries = artifacts("attempts"), artifacts("summary")
    assert artifact_key(run_config, "summary") == "kforge-artifact-night-cpu-summary"
    assert len(tables) == 2 and len(summaries) == 2
    latest_table = max(tables, key=lambda a: a.created)
    rows = json.loads(latest_table.data) if isinstance(latest_table.data, str) else latest_table.data
    assert [(row["problem_id"], row["outcome"]) for row in rows] == [("1_gelu", "correct")]
    assert rows[0]["speedup_eager"] > 0 and rows[0]["runtime_ms"] > 0
    texts = {str(a.data) for a in summaries}
    assert any(first["run_id"] in text and "No comparison" in text for text in texts)
    latest = max(summaries, key=lambda a: a.created).data
    assert second["run_id"] in latest and "kforge compare" in latest and first["run_id"] in latest


def test_a_run_that_regressed_ends_in_a_state_named_regressed(prefect_server, tmp_path, config):
    """The same suite twice; the second time its problem computes twice the GELU, which the offline
    agent's kernel (GELU) no longer matches: `correct` becomes `numerical_mismatch`, a new failure, and
    the flow run's final state says so (what `prefect flow-run ls` and the UI show)."""
    suite = tmp_path / "regress-night"  # a suite name of its own: runs are compared per suite name
    suite.mkdir()
    problem = (SMOKE / "1_gelu.py").read_text()
    (suite / "1_gelu.py").write_text(problem)
    run_config = config.model_copy(
        update={"suite": str(suite), "results_dir": str(tmp_path / "results"), "iterations": 0}
    )
    first = run_suite(run_config, return_state=True)
    assert first.name == "Completed" and first.result()["regressed"] is False

    doubled = problem.replace("return self.gelu(x)", "return 2 * self.gelu(x)")
    assert doubled != problem
    (suite / "1_gelu.py").write_text(doubled)
    second = run_suite(run_config, return_state=True)

    assert second.is_completed() and second.name == "Regressed", (second.name, second.message)
    summary = second.result()
    assert summary["regressed"] is True and summary["outcomes"] == {"numerical_mismatch": 1}
    assert f"kforge compare {summary['run_id']}" in second.message


def test_a_new_run_reuses_the_baselines_of_an_earlier_one_only_when_asked(prefect_server, tmp_path, config):
    """`reuse_baselines`: a nightly rerun of the same suite on the same host and toolchain takes each
    problem's baseline stage from the cache; without it every run times its baselines again."""
    suite = tmp_path / "baseline-night"
    suite.mkdir()
    (suite / "1_gelu.py").write_text((SMOKE / "1_gelu.py").read_text() + "\n# reuse_baselines\n")
    run_config = config.model_copy(  # no fixed seed: each run draws its own from its run id, as a nightly run does
        update={"suite": str(suite), "results_dir": str(tmp_path / "results"), "iterations": 0, "base_seed": None}
    )
    reusing = run_config.model_copy(update={"reuse_baselines": True})
    for name, settings in (("reuse-1", reusing), ("reuse-2", reusing), ("fresh", run_config)):
        with tags(f"baselines-{name}"):
            assert run_suite(settings, return_state=True).is_completed()

    # with reuse the first run times the baseline and the second reuses it; without, a run times its own
    assert stage_states("baselines-reuse-1")[("baseline", "Completed")] == 1
    reused = stage_states("baselines-reuse-2")
    assert reused[("baseline", "Cached")] == 1 and reused[("baseline", "Completed")] == 0
    assert stage_states("baselines-fresh")[("baseline", "Completed")] == 1
    assert reused[("time", "Completed")] == 1  # the candidate is still timed afresh, beside its paired reference


def test_a_profiled_run_lands_each_correct_kernel_and_the_reference_in_the_profiles_table(
    prefect_server, tmp_path, config
):
    suite = tmp_path / "profiled"
    suite.mkdir()
    (suite / "1_gelu.py").write_text((SMOKE / "1_gelu.py").read_text() + "\n# profiled\n")
    results_dir = tmp_path / "results"
    run_config = config.model_copy(
        update={"suite": str(suite), "results_dir": str(results_dir), "iterations": 0, "profile": True}
    )
    summary = run_suite(run_config)

    assert summary["outcomes"] == {"correct": 1}
    attempt = results.load("attempts", results_dir).iloc[0]
    profiles = results.load("profiles", results_dir)
    assert set(profiles["tool"]) == {"torch.profiler"} and set(profiles["problem_id"]) == {"1_gelu"}
    candidate = profiles[profiles["attempt_id"] == attempt["attempt_id"]]
    reference = profiles[profiles["attempt_id"].isna()]
    assert len(candidate) and len(reference)
    assert "aten::gelu" in set(reference["kernel"])  # the reference's own op, with its self time
    assert (reference[reference["metric"] == "self_time_us"]["value"] >= 0).all()
