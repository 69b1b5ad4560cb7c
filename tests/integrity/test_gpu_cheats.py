"""INTEGRITY.md rows that need a GPU: work hidden on a side stream, and an honest twin that must pass."""

from pathlib import Path

import pytest
import torch

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


def test_work_hidden_on_a_side_stream_is_charged_to_the_call(config):
    """Rows 2 and 16: the events around forward see nothing of work on a stream the current stream
    never waits for, but the orchestrator's clock runs until the worker has synchronized the device,
    so the call's time holds the hidden work, whatever its size."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    honest = evaluate_in_worker("time", PROBLEM, relu_candidate(on_side_stream=False), gpu)
    assert honest["outcome"] == "correct", honest
    assert honest["runtime_ms"] > 0.2, honest

    hidden = evaluate_in_worker("time", PROBLEM, relu_candidate(on_side_stream=True), gpu)
    assert hidden["outcome"] == "correct", hidden
    assert hidden["claimed_ms"] < 0.5 * honest["runtime_ms"], hidden  # what the events alone would say
    assert hidden["timing_source"] == "observed", hidden
    assert hidden["runtime_ms"] > 0.8 * honest["runtime_ms"], (hidden, honest)


def test_one_small_launch_on_a_private_stream_is_charged_too(config):
    """The attack that beat the 0.1 ms floor: one ~20 us ReLU on a private non-blocking stream."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    private = HONEST.replace(
        "        lib.relu(x, y, x.numel())\n",
        "        side = torch.cuda.Stream()\n"
        "        with torch.cuda.stream(side):\n            lib.relu(x, y, x.numel())\n",
    )
    assert private != HONEST
    honest = evaluate_in_worker("time", PROBLEM, HONEST, gpu)
    hidden = evaluate_in_worker("time", PROBLEM, private, gpu)
    assert honest["outcome"] == hidden["outcome"] == "correct", (honest, hidden)
    assert hidden["runtime_ms"] > 0.8 * honest["runtime_ms"], (hidden, honest)


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


def test_no_timed_call_gets_inputs_seen_before(config):
    """Rows 3 and 15 on a GPU: a kernel that would look its output up by a few input values never
    finds them, since every call's inputs are new (this one fails loudly if it ever does)."""
    gpu = config.model_copy(update={"backend": "cuda"})
    launch = "        lib.relu(x, y, x.numel())\n"
    remembering = HONEST.replace(
        launch,
        launch + "        key = float(x[0, :8].sum())\n        if key in self.seen:\n"
        "            raise RuntimeError('inputs seen before')\n        self.seen[key] = True\n",
    ).replace("        super().__init__()\n", "        super().__init__()\n        self.seen = {}\n")
    assert "self.seen = {}" in remembering and "key in self.seen" in remembering
    for stage in ("compile", "verify", "time"):
        result = evaluate_in_worker(stage, PROBLEM, remembering, gpu)
        assert result["outcome"] == "correct", (stage, result)


@pytest.fixture
def busy_gpu():
    """Another process keeping the GPU busy with matmuls for the test (at most 10 minutes)."""
    import subprocess
    import sys
    import time

    load = (
        "import time, torch\na = torch.randn(8192, 8192, device='cuda')\nend = time.time() + 600\n"
        "while time.time() < end:\n    a @ a\n    torch.cuda.synchronize()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", load])
    time.sleep(5)  # its CUDA context and first matmuls
    yield
    process.kill()
    process.wait()


def test_honest_kernels_stay_correct_while_another_process_keeps_the_gpu_busy(config, busy_gpu):
    """INTEGRITY.md row 20 on the GPU host: a check that fires on a busy GPU is a defect."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    for candidate in (HONEST, relu_candidate(on_side_stream=False)):
        for stage in ("compile", "verify", "time"):
            result = evaluate_in_worker(stage, PROBLEM, candidate, gpu)
            assert result["outcome"] == "correct", (stage, result)


# The harness's call step replaced (and the guard blinded): past the first five calls, each call
# launches its kernels and replies at once, without waiting for the device.
REPLIES_BEFORE_THE_DEVICE_IS_DONE = """
import sys
session = sys.modules["tasks.harness.session"]
sys.modules["tasks.harness.guard"].patched = lambda bindings: []
honest_call, calls = session._call, [0]

def early(step, model, device, state, bindings, classify):
    calls[0] += 1
    if model is state.get("echo_model") or calls[0] <= 5:
        return honest_call(step, model, device, state, bindings, classify)
    state["outputs"][0].copy_(model(*[t for t in state["inputs"]]))  # queued, not waited for
    return {"claimed_ms": 0.001, "ops": [] if step.get("record") else None}

session._call = early
"""


@pytest.mark.xfail(
    reason="known hole, measured on an H200: a candidate that replaces the harness's call step can reply "
    "before its kernels finish; 20 ReLU launches (0.70 ms honest) came out at 0.041 ms, and a probe kernel "
    "of the orchestrator's after the reply did not wait for them. The orchestrator needs its own view of the "
    "device's completion (an event it records, or a trace) to close it.",
)
def test_replying_before_the_device_is_done_gains_nothing(config):
    """Work still running on the device after a reply holds the device when the orchestrator next
    uses it, and that wait is charged to the call (or the output it snapshots is wrong)."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    slow = relu_candidate(on_side_stream=False)
    early = slow.replace("import torch\n", "import torch\n" + REPLIES_BEFORE_THE_DEVICE_IS_DONE, 1)
    assert early != slow
    honest = evaluate_in_worker("time", PROBLEM, slow, gpu)
    cheat = evaluate_in_worker("time", PROBLEM, early, gpu)
    assert honest["outcome"] == "correct", honest
    if cheat["outcome"] == "correct":
        assert cheat["runtime_ms"] > 0.8 * honest["runtime_ms"], (cheat, honest)
    else:
        assert (cheat["outcome"], cheat["error_class"]) == ("integrity_violation", "timed_output"), cheat
