"""Fixtures shared by all test directories: a small, fast run configuration and a source writer."""

import textwrap
from pathlib import Path

import pytest

from kforge.config import RunConfig


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """One cache for the whole session, so a kernel compiled by one test is loaded by the next."""
    return tmp_path_factory.mktemp("kforge-cache")


@pytest.fixture
def config(session_cache) -> RunConfig:
    """Few trials and short timing, fixed seed, no torch.compile baseline (25 s on 2 cores), a worker pool."""
    return RunConfig(
        cache_dir=str(session_cache),
        torch_compile_baseline=False,
        threads=2,
        min_timed_runs=3,
        max_timed_runs=10,
        timing_budget_s=0.05,
        correctness_trials=2,
        base_seed=7,
        # Workers started ahead of need: each evaluation skips the 2 s start-up (the cpu default too).
        worker_pool=1,
    )


@pytest.fixture
def write_source(tmp_path):
    """write_source("dir/name.py", text) writes dedented `text` under tmp_path and returns its path."""

    def write(relative_path: str, text: str) -> Path:
        path = tmp_path / relative_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    return write


@pytest.fixture
def unused_port() -> int:
    """A local port nothing listens on (a dead model endpoint)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
