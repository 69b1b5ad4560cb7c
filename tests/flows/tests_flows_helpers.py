"""Helpers shared by the flow tests."""

from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow
from prefect.states import Scheduled


def retry_flow_run(flow, flow_run_id, parameters):
    """What the UI's Retry does: set the same flow run back to Scheduled and execute it again."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Scheduled(), force=True)
        flow_run = client.read_flow_run(flow_run_id)
    return run_flow(flow, flow_run=flow_run, parameters=parameters, return_type="state")
