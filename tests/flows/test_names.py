"""What the Prefect UI shows: the suite's flow run named after suite, backend, model and date; each
stage's task run after its problem and iteration (`compile 1_relu #0`), read back from the API."""

import shutil
from pathlib import Path

from prefect import tags
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterTags
from prefect.client.schemas.sorting import TaskRunSort

from flows.suite import run_suite

SMOKE = Path(__file__).resolve().parents[2] / "data" / "problems" / "smoke"


def test_flow_and_task_runs_are_named_after_suite_problem_and_iteration(prefect_server, config, tmp_path):
    suite = tmp_path / "nightly"
    suite.mkdir()
    shutil.copy(SMOKE / "1_relu.py", suite / "1_relu.py")  # its first offline proposal does not compile
    run_config = config.model_copy(update={"suite": str(suite), "results_dir": str(tmp_path / "results")})

    with tags("test-names"):
        state = run_suite(run_config, return_state=True)
    assert state.is_completed(), state.message

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
        task_runs = client.read_task_runs(
            task_run_filter=TaskRunFilter(tags=TaskRunFilterTags(all_=["test-names"])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            limit=100,
        )
    assert flow_run.name == f"nightly cpu reference {flow_run.expected_start_time.date().isoformat()}"
    names = [run.name for run in task_runs if " " in run.name]
    assert names == [
        "record-run running",
        "generate 1_relu #0",
        "baseline 1_relu",
        "compile 1_relu #0",
        "record-attempt 1_relu #0",
        "generate 1_relu #1",
        "compile 1_relu #1",
        "verify 1_relu #1",
        "time 1_relu #1",
        "record-attempt 1_relu #1",
        "record-run finished",
    ]
