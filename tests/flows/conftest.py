"""A real ephemeral Prefect server (temporary database) for the flow tests."""

import pytest
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
from prefect.testing.utilities import prefect_test_harness


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    storage = tmp_path_factory.mktemp("prefect-results")
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: storage, PREFECT_SERVER_ANALYTICS_ENABLED: False}):
        with prefect_test_harness(server_startup_timeout=120):
            yield
