"""Several hosts on Prefect's own machinery: a suite run hands each problem to the per-problem deployment
of prefect.yaml, two process workers of one pool stand in for two hosts (each named by KFORGE_HOST), and
every attempt lands in one results dataset, which the suite reads back for its summary. A real
`prefect server start`, real `prefect deploy` and `prefect worker start`, the CPU backend."""

from pathlib import Path

import pytest
import yaml
from test_prefect_server import FAST_SETTINGS, SMOKE, Operator, free_port, log_tail, operator_env, wait_for_health

from kforge import results
from kforge.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
POOL = "kforge-hosts"
DEPLOYMENT = "synthesize-problem/kforge-problem"

pytestmark = pytest.mark.slow


def test_two_workers_standing_in_for_two_hosts_share_one_suite_run(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.suite import run_suite

    api_url = f"http://127.0.0.1:{free_port()}/api"
    prefect = Operator(operator_env(tmp_path / "prefect", api_url))
    host, port = api_url.removeprefix("http://").removesuffix("/api").split(":")
    server = prefect.start(tmp_path / "server.log", "server", "start", "--host", host, "--port", port)
    workers = []
    try:
        wait_for_health(api_url, server, tmp_path / "server.log")
        created = prefect("work-pool", "create", POOL, "--type", "process")
        assert created.returncode == 0, created.stdout + created.stderr
        project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
        (problem_deployment,) = [d for d in project["deployments"] if d["name"] == DEPLOYMENT.split("/")[1]]
        problem_deployment["work_pool"]["name"] = POOL
        prefect_file = tmp_path / "prefect.yaml"
        prefect_file.write_text(yaml.safe_dump(project, sort_keys=False))
        deployed = prefect("deploy", "--name", "kforge-problem", "--no-prompt", "--prefect-file", str(prefect_file))
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]

        for name in ("host-a", "host-b"):  # one flow run at a time each, as on a one-GPU host
            log = tmp_path / f"worker-{name}.log"
            extra = {"KFORGE_HOME": str(ROOT), "KFORGE_HOST": name}
            worker = prefect.start(log, "worker", "start", "--pool", POOL, "--limit", "1", extra_env=extra)
            workers.append((worker, log))

        suite = tmp_path / "suite"
        suite.mkdir()
        for name in ("1_relu.py", "1_gelu.py", "1_sum_dim.py"):
            (suite / name).write_text((SMOKE / name).read_text() + "\n# tests/test_hosts.py\n")
        config = RunConfig(
            suite=str(suite),
            backend="cpu",
            agent="identity",  # each problem's reference as its candidate: correct wherever it runs
            iterations=0,
            results_dir=str(tmp_path / "shared-results"),  # the path every host reaches
            cache_dir=str(tmp_path / "cache"),
            problem_deployment=DEPLOYMENT,
            **FAST_SETTINGS,
        )
        with temporary_settings({PREFECT_API_URL: api_url}):
            summary = run_suite(config)
    finally:
        for worker, _ in workers:
            Operator.stop(worker)
        Operator.stop(server)

    logs = "\n".join(log_tail(log) for _, log in workers)
    assert summary["outcomes"] == {"correct": 3}, (summary, logs)
    attempts = results.load("attempts", config.results_dir)
    assert set(attempts["run_id"]) == {summary["run_id"]}
    assert sorted(attempts["problem_id"]) == ["1_gelu", "1_relu", "1_sum_dim"]
    assert set(attempts["host"]) == {"host-a", "host-b"}, (attempts[["problem_id", "host"]], logs)
    assert results.load("runs", config.results_dir)["status"].tolist() == ["finished"]
