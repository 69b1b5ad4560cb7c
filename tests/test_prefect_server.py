"""The operations path of the README against a real `prefect server start`: create the work pool, deploy
prefect.yaml, list pools, deployments and flow runs, run a deployment through a process worker, and retry
a failed deployed run as the UI's Retry does.

Why the pins are what they are: Prefect 3.8 cannot start its server with FastAPI >= 0.155 ("Body() got
an unexpected keyword argument 'min_items'"), and FastAPI 0.151 to 0.154 answer the nulls Prefect's own
client sends (`"limit": null` in every `.../filter` body) with 422, so `prefect deploy` exits 1 after
creating the deployment and `prefect work-pool ls`, `deployment ls` and `flow-run ls` fail. FastAPI 0.150.0
is the newest that does neither; Prefect 3.9.1 itself requires fastapi<0.151 for the same reason. The
other tests drive flows in-process against an ephemeral server and never run these commands, a deploy or a
worker, so a pin that breaks operations passes them.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from uuid import UUID

import pytest
import yaml

from kforge import results

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "data" / "problems" / "smoke"
POOL = "kforge-cpu"
DEPLOYMENT = "run-suite/nightly-smoke-cpu"
# The conftest `config` fixture's fast settings: few trials, short timing, no torch.compile baseline.
FAST_SETTINGS = {
    "torch_compile_baseline": False,
    "threads": 2,
    "min_timed_runs": 3,
    "max_timed_runs": 10,
    "timing_budget_s": 0.05,
    "correctness_trials": 2,
    "base_seed": 7,
    "worker_pool": 1,
}
FLOW_RUN_TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_problem_suite(folder: Path, marker: str) -> Path:
    """A suite of 1_relu alone; `marker` makes its source, and so its stages' cache keys, its own."""
    folder.mkdir(parents=True)
    (folder / "1_relu.py").write_text((SMOKE / "1_relu.py").read_text() + f"\n# {marker}\n")
    return folder


def log_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


class Operator:
    """Runs `prefect ...` as an operator would: a subprocess of this venv's Prefect, talking to one server."""

    def __init__(self, env: dict[str, str]):
        self.env = env

    def __call__(self, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "prefect", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=cwd,
            timeout=300,
        )

    def start(self, log: Path, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        """A long-running `prefect` command in a process group of its own, so `stop` ends its children too."""
        with log.open("w") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "prefect", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, **(extra_env or {})},
                cwd=ROOT,
                start_new_session=True,
            )

    @staticmethod
    def stop(process: subprocess.Popen) -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def operator_env(prefect_home: Path, api_url: str) -> dict[str, str]:
    """This environment without Prefect's settings, pointed at one server with its own PREFECT_HOME."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(prefect_home),
        PREFECT_API_URL=api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        # The nightly cron must not add runs of its own (with the deployment's defaults) while the test runs.
        PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED="false",
        PREFECT_WORKER_QUERY_SECONDS="1",
        COLUMNS="240",  # Rich's tables keep whole names
    )
    # prefect.yaml's pull step works in $KFORGE_HOME. `prefect deploy` would write its own value into the
    # deployment; unset there, each worker's flow runs read the worker's (the checkout on that host).
    env.pop("KFORGE_HOME", None)
    return env


def wait_for_health(api_url: str, server: subprocess.Popen, log: Path, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, f"prefect server start exited {server.returncode}:\n{log_tail(log)}"
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"no answer from {api_url}/health after {timeout_s:.0f} s:\n{log_tail(log)}")


@pytest.fixture(scope="module")
def operations(tmp_path_factory):
    """A server, the kforge-cpu pool, prefect.yaml deployed and a process worker: the README's set-up.

    Yields (operator, workdir). The deployed prefect.yaml is the repository's own with only the
    parameters changed (a one-problem suite, results, cache and fast timing under `workdir`)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    workdir = tmp_path_factory.mktemp("operations")
    api_url = f"http://127.0.0.1:{free_port()}/api"
    prefect = Operator(operator_env(workdir / "prefect", api_url))
    server_log, worker_log = workdir / "server.log", workdir / "worker.log"
    host, port = api_url.removeprefix("http://").removesuffix("/api").split(":")
    server = prefect.start(server_log, "server", "start", "--host", host, "--port", port)
    worker = None
    try:
        wait_for_health(api_url, server, server_log)
        created = prefect("work-pool", "create", POOL, "--type", "process")
        assert created.returncode == 0, created.stdout + created.stderr

        project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
        (deployment,) = [d for d in project["deployments"] if d["name"] == DEPLOYMENT.split("/")[1]]
        deployment["parameters"]["config"].update(
            suite=str(one_problem_suite(workdir / "suite", "tests/test_prefect_server.py: deployed")),
            results_dir=str(workdir / "results"),
            cache_dir=str(workdir / "cache"),
            **FAST_SETTINGS,
        )
        prefect_file = workdir / "prefect.yaml"
        prefect_file.write_text(yaml.safe_dump(project, sort_keys=False))
        # From the checkout: `prefect deploy` loads the entrypoint (flows/suite.py) relative to its cwd.
        deployed = prefect("deploy", "--all", "--no-prompt", "--prefect-file", str(prefect_file))
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        assert f"Deployment '{DEPLOYMENT}' successfully created" in " ".join(deployed.stdout.split())

        worker = prefect.start(worker_log, "worker", "start", "--pool", POOL, extra_env={"KFORGE_HOME": str(ROOT)})
        with temporary_settings({PREFECT_API_URL: api_url}):
            yield prefect, workdir
    finally:
        if worker is not None:
            Operator.stop(worker)
        Operator.stop(server)


def start_deployment_run(prefect: Operator, *args: str) -> UUID:
    started = prefect("deployment", "run", DEPLOYMENT, *args)
    assert started.returncode == 0, started.stdout + started.stderr
    return UUID(re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1))


def wait_until_final(flow_run_id: UUID, worker_log: Path):
    """The flow run once it is in a final state (Completed, Failed, Crashed, Cancelled)."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + FLOW_RUN_TIMEOUT_S
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            flow_run = client.read_flow_run(flow_run_id)
            if flow_run.state is not None and flow_run.state.is_final():
                return flow_run
            time.sleep(2)
    pytest.fail(f"flow run {flow_run_id} unfinished after {FLOW_RUN_TIMEOUT_S} s; worker log:\n{log_tail(worker_log)}")


def stage_states(created_after: datetime, created_before: datetime | None = None) -> Counter:
    """(stage, state name) counts of the task runs created in that window (one flow run at a time here)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(sort=TaskRunSort.EXPECTED_START_TIME_ASC, limit=200)
    window = [
        run
        for run in task_runs
        if run.created >= created_after and (created_before is None or run.created < created_before)
    ]
    # Stage runs are named `compile 1_relu #0`, the rest keep Prefect's `load-suite-0c3`.
    return Counter(
        (run.name.split(" ")[0] if " " in run.name else run.name.rsplit("-", 1)[0], run.state.name) for run in window
    )


def test_deploy_then_run_through_a_worker(operations):
    """prefect.yaml deploys and its run-suite runs in a process worker, and the listings an operator uses
    work. With FastAPI 0.151-0.154 (Prefect 3.8.8's client sends nulls they refuse) the deploy in the
    fixture exits 1 and every `ls` here fails with 422; with FastAPI >= 0.155 the server does not start."""
    from prefect.client.orchestration import get_client

    prefect, workdir = operations
    pools = prefect("work-pool", "ls")
    assert pools.returncode == 0 and POOL in pools.stdout, pools.stdout + pools.stderr
    deployments = prefect("deployment", "ls")
    assert deployments.returncode == 0 and DEPLOYMENT in deployments.stdout, deployments.stdout + deployments.stderr
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
    # Left for the worker to fill in: the deploy ran without KFORGE_HOME, the worker has it.
    assert deployment.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $KFORGE_HOME }}"}}
    ]
    assert deployment.schedules and deployment.schedules[0].schedule.cron == "0 2 * * *"

    flow_run_id = start_deployment_run(prefect)
    flow_run = wait_until_final(flow_run_id, workdir / "worker.log")
    assert flow_run.state.is_completed(), f"{flow_run.state.name}: {flow_run.state.message}"
    assert flow_run.name.startswith("suite cpu reference ")  # suite_run_name: the suite folder's name

    runs = prefect("flow-run", "ls")
    assert runs.returncode == 0 and str(flow_run_id)[:8] in runs.stdout, runs.stdout + runs.stderr
    attempts = results.load("attempts", workdir / "results")
    assert set(attempts["run_id"]) == {str(flow_run_id)}
    # The offline agent's 1_relu: a draft that does not compile, then the working kernel (iterations: 1).
    assert attempts.sort_values("iteration")["outcome"].tolist() == ["compile_error", "correct"]
    assert results.load("runs", workdir / "results")["status"].tolist() == ["finished"]


def test_retry_of_a_failed_deployed_run_redoes_only_what_failed(operations):
    """A deployed run that fails for an infrastructure reason (the attempts dataset cannot be written),
    retried as the UI's Retry does (AwaitingRetry, forced), is picked up by the worker again and completes;
    its finished stages replay from Prefect's result store under the worker's PREFECT_HOME. Needs the same
    pins as the deploy test: the worker and the client reach the real server's filter endpoints."""
    from prefect.client.orchestration import get_client
    from prefect.states import AwaitingRetry

    prefect, workdir = operations
    results_dir = workdir / "blocked-results"
    results_dir.mkdir()
    blocker = results_dir / "attempts"
    blocker.write_text("a file where the attempts dataset should be: every attempt write fails")
    config = {
        "suite": str(one_problem_suite(workdir / "retry-suite", "tests/test_prefect_server.py: retry")),
        "backend": "cpu",
        "iterations": 0,
        "results_dir": str(results_dir),
        "cache_dir": str(workdir / "cache"),
        **FAST_SETTINGS,
    }

    first_started = datetime.now(timezone.utc)
    flow_run_id = start_deployment_run(prefect, "--params", json.dumps({"config": config}))
    failed = wait_until_final(flow_run_id, workdir / "worker.log")
    assert failed.state.is_failed(), f"{failed.state.name}: {failed.state.message}"
    assert "1 problem(s) failed: 1_relu" in failed.state.message

    blocker.unlink()  # the infrastructure is fixed; the operator presses Retry on the failed flow run
    retried_at = datetime.now(timezone.utc)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, AwaitingRetry(message="Retry from the UI"), force=True)
    retried = wait_until_final(flow_run_id, workdir / "worker.log")
    assert retried.state.is_completed(), f"{retried.state.name}: {retried.state.message}"
    assert retried.run_count == 2

    first, second = stage_states(first_started, retried_at), stage_states(retried_at)
    assert first[("record-attempt", "Failed")] == 1
    assert first[("compile", "Completed")] == 1
    # Only the write that failed runs again; every stage before it is a cache hit.
    for stage in ("generate", "baseline", "compile"):
        assert second[(stage, "Cached")] == 1 and second[(stage, "Completed")] == 0, (stage, second)
    assert second[("record-attempt", "Completed")] == 1

    attempts = results.load("attempts", results_dir)
    assert list(zip(attempts["run_id"], attempts["problem_id"], attempts["outcome"])) == [
        (str(flow_run_id), "1_relu", "compile_error")
    ]
    assert results.load("runs", results_dir)["status"].tolist() == ["finished"]
