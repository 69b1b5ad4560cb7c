"""prefect.yaml stays in step with the code: every deployment's entrypoint is a flow and its
parameters validate against that flow's signature (what `prefect deploy --all` would register)."""

import importlib
from pathlib import Path

import pytest
import yaml
from prefect import Flow

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENTS = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d["name"])
def test_deployment_entrypoint_and_parameters(deployment):
    module_path, flow_name = deployment["entrypoint"].split(":")
    module = importlib.import_module(module_path.removesuffix(".py").replace("/", "."))
    flow = getattr(module, flow_name)
    assert isinstance(flow, Flow)
    if flow.name == "synthesize-problem":  # a suite's problems are handed to it: no schedule, no parameters
        assert "schedules" not in deployment and "parameters" not in deployment
        return
    parameters = flow.validate_parameters(deployment["parameters"])
    assert (ROOT / parameters["config"].suite).is_dir()
    assert deployment["schedules"][0]["cron"]
