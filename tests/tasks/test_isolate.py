"""Workers started ahead of need (`worker_pool`): still one process per request, so what a candidate
does to its process (a crash, a patched torch, a hang) never reaches the next request."""

import textwrap
from pathlib import Path

import pytest

from tasks.judge import evaluate_in_worker
from tasks.pool import worker_pool

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = (ROOT / "data" / "problems" / "smoke" / "1_relu.py").read_text()
HONEST = (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()
# Patches the op the reference uses, then crashes: in a reused process the next reference would be wrong.
POISONER = textwrap.dedent(
    """
    import os, signal, torch
    import torch.nn as nn

    class ModelNew(nn.Module):
        def forward(self, x):
            torch.relu = lambda x: x * 0
            os.kill(os.getpid(), signal.SIGSEGV)
    """
)
HANG = (
    "import torch.nn as nn\n\n"
    "class ModelNew(nn.Module):\n    def forward(self, x):\n        while True:\n            pass\n"
)


def test_pooled_workers_isolate_each_request(config):
    pooled = config.model_copy(update={"worker_pool": 1, "run_timeout_s": 20})
    assert worker_pool(1) is worker_pool(1) and worker_pool(0) is None

    crashed = evaluate_in_worker("verify", PROBLEM, POISONER, pooled)
    assert (crashed["outcome"], crashed["error_class"]) == ("runtime_error", "SIGSEGV")

    honest = evaluate_in_worker("verify", PROBLEM, HONEST, pooled)
    assert honest["outcome"] == "correct", honest  # a fresh process: torch.relu is torch's again

    hung = evaluate_in_worker("verify", PROBLEM, HANG, pooled)
    assert (hung["outcome"], hung["error_class"]) == ("timeout", "wall_time_limit")
    timed = evaluate_in_worker("time", PROBLEM, HONEST, pooled)
    assert timed["outcome"] == "correct" and timed["runtime_ms"] > 0


def test_candidates_have_no_network(config):
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        phone_home = HONEST.replace(
            "from kforge.kernels import load_cpp",
            "from kforge.kernels import load_cpp\nimport socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
            "    raise RuntimeError('reached the orchestrator over the network')\nexcept OSError:\n    pass",
        )
        result = evaluate_in_worker("verify", PROBLEM, phone_home, config)
    if not result.get("network_isolated"):
        pytest.skip("this host allows no network namespaces (unshare needs root or user namespaces)")
    assert result["outcome"] == "correct", result


def test_a_stopped_process_starts_workers_again_for_its_next_run(tmp_path):
    from tasks import isolate

    isolate.stop_workers()
    try:
        with pytest.raises(isolate.Stopping):
            isolate.check_stopping()
    finally:
        isolate.resume_workers()
    isolate.check_stopping()  # raises nothing: a new run may start workers


def test_workers_tear_cupti_down_after_a_trace_unless_told_not_to(tmp_path, monkeypatch):
    """A watched call's trace would otherwise leave CUPTI subscribed and every later launch of the
    worker slower (a launch-bound identity candidate read 0.61x on an H200)."""
    from tasks.isolate import _worker_env

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    assert _worker_env(tmp_path, 1)["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # a side-by-side run with it kept
    assert _worker_env(tmp_path, 1)["TEARDOWN_CUPTI"] == "0"
