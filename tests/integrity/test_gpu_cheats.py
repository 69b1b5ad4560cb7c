"""INTEGRITY.md rows that need a GPU: work hidden on a side stream, and an honest twin that must pass."""

import textwrap
from pathlib import Path

import pytest
import torch

from tasks.harness.timing import Timing, hidden_work_ms
from tasks.judge import evaluate_in_worker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = (ROOT / "data" / "problems" / "smoke" / "1_relu.py").read_text()


def relu_candidate(on_side_stream: bool) -> str:
    """ReLU applied 20 times (the same result), on the current stream or on a side stream that the
    current stream never waits for: the events around forward would time nothing."""
    stream = "torch.cuda.Stream()" if on_side_stream else "torch.cuda.current_stream()"
    return f"""
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = {stream}

    def forward(self, x):
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            y = x.clamp_min(0)
            for _ in range(19):
                y = y.clamp_min(0)
        return y
"""


def honest_timing(result: dict) -> Timing:
    return Timing(result["runtime_ms"], 0.0, 0.0, 1, None, 0, sync_gap_ms=result["sync_gap_ms"])


def test_work_hidden_on_a_side_stream_is_caught_and_the_honest_twin_is_timed(config):
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    honest = evaluate_in_worker("time", PROBLEM, relu_candidate(on_side_stream=False), gpu)
    assert honest["outcome"] == "correct", honest
    assert honest["runtime_ms"] > 0.2 and hidden_work_ms(honest_timing(honest)) is None

    hidden = evaluate_in_worker("time", PROBLEM, relu_candidate(on_side_stream=True), gpu)
    assert (hidden["outcome"], hidden["error_class"]) == ("integrity_violation", "side_stream"), hidden
    assert "escapes the timing window" in hidden["error_excerpt"]


HONEST = (ROOT / "kernels_ref" / "cuda" / "1_relu.py").read_text()
# Row 5: an output buffer the kernel never writes, in the hope that it holds the reference's result
# from memory the reference freed. The reference runs in another process, and fresh memory reads NaN.
UNWRITTEN = HONEST.replace("lib.relu(x, y, x.numel())", "pass")
# Row 11: a kernel that writes 4 TiB past its output: an illegal address that kills the CUDA context.
ILLEGAL_ADDRESS = HONEST.replace("if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;", "if (i < n) y[i + (1LL << 40)] = x[i];")


def test_output_left_to_freed_memory_is_caught(config):
    gpu = config.model_copy(update={"backend": "cuda"})
    caught = evaluate_in_worker("verify", PROBLEM, UNWRITTEN, gpu)
    assert (caught["outcome"], caught["error_class"]) == ("numerical_mismatch", "nonfinite"), caught


def test_illegal_address_takes_down_only_its_worker(config):
    gpu = config.model_copy(update={"backend": "cuda"})
    crashed = evaluate_in_worker("verify", PROBLEM, ILLEGAL_ADDRESS, gpu)
    assert crashed["outcome"] == "runtime_error", crashed
    assert "illegal" in crashed["error_excerpt"].lower(), crashed["error_excerpt"]

    honest = evaluate_in_worker("verify", PROBLEM, HONEST, gpu)  # the next candidate: a clean worker
    assert honest["outcome"] == "correct", honest


def test_gpu_candidates_have_no_network_beside_their_cuda_context(config):
    """INTEGRITY.md row 10 on a GPU worker: the standby worker made its CUDA context before the
    network namespace, and the kernel still runs; a connection to the orchestrator's host fails."""
    import socket

    gpu = config.model_copy(update={"backend": "cuda"})
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        phone_home = HONEST.replace(
            "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
            "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        import socket\n"
            f"        try:\n            socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
            "            raise RuntimeError('reached the orchestrator over the network')\n"
            "        except OSError:\n            pass\n",
        )
        result = evaluate_in_worker("verify", PROBLEM, phone_home, gpu)
    assert result["network_isolated"] is True, result
    assert result["outcome"] == "correct", result


def test_host_memory_blow_up_beside_a_cuda_context_is_out_of_memory(config):
    """A GPU worker has no address-space limit (its CUDA context reserves more than the host has), so
    the orchestrator watches its resident memory instead: 6 GiB of touched host memory past a 4 GiB limit."""
    gpu = config.model_copy(update={"backend": "cuda", "memory_limit_mb": 4096})
    hoarding = HONEST.replace(
        "        lib.relu(x, y, x.numel())\n",
        "        lib.relu(x, y, x.numel())\n        hoard = torch.ones(3 << 29)  # 6 GiB on the host\n"
        "        import time\n        time.sleep(60)\n",
    )
    assert hoarding != HONEST

    result = evaluate_in_worker("verify", PROBLEM, hoarding, gpu)

    assert (result["outcome"], result["error_class"]) == ("runtime_error", "out_of_memory"), result
    assert "over the limit of 4096 MB" in result["error_excerpt"]


def test_outputs_remembered_by_input_contents_are_caught(config):
    """Row 3 by contents on a GPU: right results, looked up by a few input values, for the rotating
    timing sets; computed (50 launches) only for inputs it has not seen. The honest twin, 50 launches
    every call, is timed."""
    gpu = config.model_copy(update={"backend": "cuda"})
    launch = "        lib.relu(x, y, x.numel())\n"
    fifty = "        for _ in range(50):\n    " + launch
    honest = HONEST.replace(launch, fifty)
    remembering = HONEST.replace(
        "        y = torch.empty_like(x)\n" + launch + "        return y\n",
        "        key = float(x[0, :8].sum())\n        if key not in self.seen:\n"
        "            y = torch.empty_like(x)\n" + textwrap.indent(fifty, "    ") + "            self.seen[key] = y\n"
        "        return self.seen[key].clone()\n",
    ).replace("        super().__init__()\n", "        super().__init__()\n        self.seen = {}\n")
    assert honest != HONEST and "self.seen = {}" in remembering and "key not in self.seen" in remembering

    timed = evaluate_in_worker("time", PROBLEM, honest, gpu)
    assert timed["outcome"] == "correct", timed
    assert evaluate_in_worker("verify", PROBLEM, remembering, gpu)["outcome"] == "correct"
    caught = evaluate_in_worker("time", PROBLEM, remembering, gpu)
    assert (caught["outcome"], caught["error_class"]) == ("integrity_violation", "remembered_output"), caught
