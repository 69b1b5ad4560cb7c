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


def test_work_hidden_on_a_side_stream_is_caught_in_verify_and_charged_in_time(config):
    """Rows 2 and 16: the events around forward see nothing of work on a stream the current stream
    never waits for. Every verify call records the device trace, where it ends after a marker on the current stream;
    in the time stage, a watched call (about one in ten, at random) catches it the same way, and
    the others are charged the orchestrator's clock, which runs until the worker has synchronized."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    honest_source, hidden_source = relu_candidate(on_side_stream=False), relu_candidate(on_side_stream=True)
    assert evaluate_in_worker("verify", PROBLEM, honest_source, gpu)["outcome"] == "correct"
    caught = evaluate_in_worker("verify", PROBLEM, hidden_source, gpu)
    assert (caught["outcome"], caught["error_class"]) == ("integrity_violation", "side_stream"), caught

    honest = evaluate_in_worker("time", PROBLEM, honest_source, gpu)
    assert honest["outcome"] == "correct", honest
    assert honest["runtime_ms"] > 0.2, honest
    hidden = evaluate_in_worker("time", PROBLEM, hidden_source, gpu)
    if hidden["outcome"] == "correct":  # no watched call drawn: the time holds the hidden work
        assert hidden["timing_source"] == "observed", hidden
        assert hidden["runtime_ms"] > 0.8 * honest["runtime_ms"], (hidden, honest)
    else:
        assert (hidden["outcome"], hidden["error_class"]) == ("integrity_violation", "side_stream"), hidden


def private_stream_relu(ordered_after: bool, joined: bool) -> str:
    """The reference CUDA ReLU (one ~20-50 us launch) on a private stream created in forward, which
    waits for the current stream first (`ordered_after`) and is waited for at the end (`joined`)."""
    wait = "        side.wait_stream(torch.cuda.current_stream())\n" if ordered_after else ""
    join = "        torch.cuda.current_stream().wait_stream(side)\n" if joined else ""
    source = HONEST.replace(
        "        lib.relu(x, y, x.numel())\n",
        f"        side = torch.cuda.Stream()\n{wait}        with torch.cuda.stream(side):\n"
        f"            lib.relu(x, y, x.numel())\n{join}",
    )
    assert source != HONEST
    return source


def test_a_fresh_workers_first_watched_call_is_judged_as_any_other(config):
    """Without a standby warm-up (no pool) a worker's first watched call is also its first device
    trace: whatever the harness sets up for the trace must not show in it as the candidate's work."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True, "worker_pool": 0})
    honest = evaluate_in_worker("verify", PROBLEM, relu_candidate(on_side_stream=False), gpu)
    assert honest["outcome"] == "correct", honest


@pytest.mark.parametrize("ordered_after", [False, True], ids=["unordered", "ordered-after"])
def test_one_small_launch_on_a_private_stream_is_caught(config, ordered_after):
    """The attack that beat the 0.1 ms floor, and then the observed time (its round trip's noise is
    larger than the kernel): one short ReLU on a private stream the current stream never waits for.
    In the device trace of a verify call it starts before a gate kernel on the current stream ends
    (unordered), or ends after the marker kernel queued behind the gate starts (ordered after the
    current stream), whatever its size. The honest twin joins its stream back and stays correct."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    honest = evaluate_in_worker("verify", PROBLEM, private_stream_relu(ordered_after=True, joined=True), gpu)
    hidden = evaluate_in_worker("verify", PROBLEM, private_stream_relu(ordered_after, joined=False), gpu)
    assert honest["outcome"] == "correct", honest
    assert (hidden.get("outcome"), hidden.get("error_class")) == ("integrity_violation", "side_stream"), hidden
    assert "outside the current stream's span of the call" in hidden["error_excerpt"], hidden


HONEST = (ROOT / "kernels_ref" / "cuda" / "1_relu.py").read_text()


# Row 16 against the trace itself: native code (ctypes here) turns CUPTI's kernel records off inside
# forward, so the watched call's device trace holds neither the marker nor the hidden launch.
CUPTI_HELPER = """import ctypes


def _cupti():
    with open("/proc/self/maps") as maps:
        return ctypes.CDLL(next(line.split()[-1] for line in maps if "/libcupti.so" in line))


class ModelNew(nn.Module):"""


def trace_turned_off() -> str:
    source = private_stream_relu(ordered_after=False, joined=False)
    source = source.replace("class ModelNew(nn.Module):", CUPTI_HELPER, 1).replace(
        "        side = torch.cuda.Stream()\n",
        "        _cupti().cuptiActivityDisable(10)  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL\n"
        "        side = torch.cuda.Stream()\n",
    )
    assert "cuptiActivityDisable" in source and "def _cupti" in source
    return source


def test_a_candidate_that_turns_the_device_trace_off_is_caught(config):
    """With kernel records turned off after the gate, the side-stream kernel's launch is in the trace
    but its kernel is not, so the side-stream check has nothing to stand on: where this process's own
    trace of the same kind is whole, that is the candidate's doing (device_trace), not a pass. The
    honest kernel's trace is whole."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    hidden = evaluate_in_worker("verify", PROBLEM, trace_turned_off(), gpu)
    assert (hidden.get("outcome"), hidden.get("error_class")) == ("integrity_violation", "device_trace"), hidden
    honest = evaluate_in_worker("verify", PROBLEM, HONEST, gpu)
    assert honest["outcome"] == "correct", honest


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


def test_replying_before_the_device_is_done_gains_nothing(config):
    """The clock stops when the orchestrator's own copy of the outputs is done: a reply sent before
    the kernels finish has that copy wait for them (charged) or read an unfinished output, which the
    paired reference's output on the same inputs shows wrong (`timed_output`), or a forged reply without
    the watched call's device trace (`device_trace`). Measured before this
    was closed, on an H200: 0.041 ms where the honest run takes 0.70 ms."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    slow = relu_candidate(on_side_stream=False)
    early = slow.replace("import torch\n", "import torch\n" + REPLIES_BEFORE_THE_DEVICE_IS_DONE, 1)
    assert early != slow
    honest = evaluate_in_worker("time", PROBLEM, slow, gpu)
    cheat = evaluate_in_worker("time", PROBLEM, early, gpu)
    assert honest["outcome"] == "correct", honest
    if cheat["outcome"] == "correct":
        # What is left to gain is the reply's own round trip, which the cheat overlaps with its kernels
        # (measured on an H200: 0.56-0.61 ms against 0.70 ms of events, with empty calls of 0.72-0.86 ms)
        assert cheat["runtime_ms"] > honest["claimed_ms"] - honest["echo_ms"] / 2, (cheat, honest)
    else:
        # its reply, sent by the candidate, either carries an unfinished output or no device trace at all
        caught = {("integrity_violation", "timed_output"), ("integrity_violation", "device_trace")}
        assert (cheat["outcome"], cheat["error_class"]) in caught, cheat


# An honest ReLU whose output is zeroed after one timed call (the first unwatched one past the sixth
# model call: warm-up is three to five calls), so only a judge of that very call can see it.
WRONG_ONCE = """
import sys
session = sys.modules["tasks.harness.session"]
sys.modules["tasks.harness.guard"].patched = lambda bindings: []
honest_call, calls = session._call, [0]

def once_wrong(step, model, device, state, bindings, classify):
    reply = honest_call(step, model, device, state, bindings, classify)
    if model is not state.get("echo_model") and not step.get("record"):
        calls[0] += 1
        if calls[0] == 7:
            state["outputs"][0].zero_()
            torch.cuda.synchronize()
    return reply

session._call = once_wrong
"""


def test_every_timed_call_is_judged_against_the_paired_reference(config):
    """One wrong timed call among ten: the reservoir sample holds it about one time in four, the
    comparison with the paired reference's output on the same inputs every time."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    honest = relu_candidate(on_side_stream=False)
    cheat = honest.replace("import torch\n", "import torch\n" + WRONG_ONCE, 1)
    assert cheat != honest
    for _ in range(2):
        caught = evaluate_in_worker("time", PROBLEM, cheat, gpu)
        assert (caught["outcome"], caught["error_class"]) == ("integrity_violation", "timed_output"), caught


# 1 GB in and out: the orchestrator's copy of each worker's output as a call ends takes about 0.5 ms
SCALE_1GB = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 3.0

def get_inputs():
    return [torch.rand(16384, 16384)]

def get_init_inputs():
    return []
"""


def test_an_identity_candidate_with_a_large_output_keeps_its_claim(config):
    """The paired reference's round trip holds the same output copy as its candidate's, so an
    identical model's claim stands. Before, its copy was missing: the candidate's floor was one 4 GB
    copy (2.2 ms on an H200) above the reference's, the claims refuted, identity speedups 0.48."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    identity = SCALE_1GB + "\nclass ModelNew(Model):\n    pass\n"
    result = evaluate_in_worker("time", SCALE_1GB, identity, gpu)
    assert result["outcome"] == "correct", result
    assert result["timing_source"] == "claimed", result
    assert 0.8 < result["runtime_ms"] / result["paired_eager_ms"] < 1.25, result


def test_an_identity_candidate_without_a_partner_keeps_its_claim_on_a_large_output(config):
    """Timed without a paired reference (as a memory plan does for the biggest problems), a
    candidate's empty-call floor and eager time come from the baseline stage, which must take the same
    output copy: without it, identity candidates on 6.4 GB outputs were refuted (0.49 of eager)."""
    from tasks.measure import speedups

    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True, "paired_reference": False})
    baseline = evaluate_in_worker("baseline", SCALE_1GB, None, gpu)
    assert baseline["outcome"] == "correct", baseline
    identity = SCALE_1GB + "\nclass ModelNew(Model):\n    pass\n"
    result = evaluate_in_worker("time", SCALE_1GB, identity, gpu, baseline["echo_ms"], baseline.get("echo_cpu_ms"))
    assert result["outcome"] == "correct", result
    assert "paired_eager_ms" not in result, result
    assert result["timing_source"] == "claimed", (result, baseline)
    assert 0.8 < speedups(result, baseline)["speedup_eager"] < 1.25, (result, baseline)


MATMUL = (ROOT / "data" / "problems" / "smoke" / "1_matmul.py").read_text()
# Row 18 past the dispatcher: cuBLAS called directly (ctypes here; C++ in an extension is the same to
# the device), so no aten::mm is ever dispatched. Only the device trace names its kernels.
CUBLAS_THROUGH_CTYPES = """
import ctypes
import torch
import torch.nn as nn


def _cublas():
    torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")  # torch loads libcublas
    with open("/proc/self/maps") as maps:
        path = next(line.split()[-1] for line in maps if "/libcublas.so" in line)
    lib = ctypes.CDLL(path)
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    return lib, handle


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.lib, self.handle = _cublas()

    def forward(self, A, B):
        M, K = A.shape
        N = B.shape[1]
        C = torch.empty(M, N, device=A.device)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.lib.cublasSetStream_v2(self.handle, stream)
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        pointer = lambda t: ctypes.c_void_p(t.data_ptr())
        # row-major C = A @ B is column-major C^T = B^T A^T
        self.lib.cublasSgemm_v2(
            self.handle, 0, 0, N, M, K, ctypes.byref(one), pointer(B), N, pointer(A), K, ctypes.byref(zero),
            pointer(C), N,
        )
        return C
"""


def test_cublas_called_past_the_dispatcher_is_seen_in_the_device_trace(config):
    """Row 18: no aten op is dispatched, but the kernels the call ran are named in the device trace;
    with library calls allowed the same candidate is correct, and the project's own CUDA matmul
    (a kernel of its own, named in its source) passes with them off."""
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": False})
    caught = evaluate_in_worker("verify", MATMUL, CUBLAS_THROUGH_CTYPES, gpu)
    assert (caught["outcome"], caught["error_class"]) == ("integrity_violation", "library_kernel"), caught

    allowed = gpu.model_copy(update={"allow_library_calls": True})
    assert evaluate_in_worker("verify", MATMUL, CUBLAS_THROUGH_CTYPES, allowed)["outcome"] == "correct"
    own = (ROOT / "kernels_ref" / "cuda" / "1_matmul.py").read_text()
    result = evaluate_in_worker("verify", MATMUL, own, gpu)
    assert result["outcome"] == "correct", result


# Another process (a worker's role) that keeps a buffer in persisting L2 lines: an access-policy
# window with hit ratio 1 over it, and the largest carve-out the device allows. Each line on stdin
# asks it to read that buffer and a plain buffer of the same size (in the order the line names),
# timed by events behind a spin and a small warm-up read (no launch gap, and no first kernel after the
# spin, is timed); it prints the held and the plain buffer's times in ms.
L2_HOLDER = """
import ctypes, struct, sys
import torch
from tasks.harness.nvrtc import driver

cu = driver()
torch.empty(1, device="cuda")
most_persisting, widest_window = ctypes.c_int(), ctypes.c_int()
cu.cuDeviceGetAttribute(ctypes.byref(most_persisting), 108, 0)  # MAX_PERSISTING_L2_CACHE_SIZE
cu.cuDeviceGetAttribute(ctypes.byref(widest_window), 109, 0)  # MAX_ACCESS_POLICY_WINDOW_SIZE
size = min(most_persisting.value, widest_window.value) // 2
held, plain = torch.rand(size // 4, device="cuda"), torch.rand(size // 4, device="cuda")
warm = torch.rand(1 << 18, device="cuda")
stream = torch.cuda.Stream()
assert cu.cuCtxSetLimit(0x06, ctypes.c_size_t(most_persisting.value)) == 0  # PERSISTING_L2_CACHE_SIZE
window = ctypes.create_string_buffer(64)  # CUstreamAttrValue: base, bytes, hit ratio, hit and miss property
struct.pack_into("PNfii", window, 0, held.data_ptr(), size, 1.0, 2, 0)  # PERSISTING, NORMAL
assert cu.cuStreamSetAttribute(ctypes.c_void_p(stream.cuda_stream), 1, window) == 0  # ACCESS_POLICY_WINDOW
print(size, flush=True)
events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
for line in sys.stdin:
    first, second = (held, plain) if line.strip() == "held" else (plain, held)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(2_000_000)
        warm.sum()
        events[0].record()
        first.sum()
        events[1].record()
        second.sum()
        events[2].record()
    events[2].synchronize()
    times = events[0].elapsed_time(events[1]), events[1].elapsed_time(events[2])
    print(*(times if first is held else times[::-1]), flush=True)
"""


def test_the_flush_evicts_lines_another_process_keeps_in_persisting_l2():
    """Row 16's cache half: a worker that sets an access-policy window over its data must not find it
    in L2 after the orchestrator's flush, which resets persisting lines and the carve-out from its own
    context before filling the cache: the held buffer reads no faster than a plain one. (On the H200
    measured on 2026-12-02 a plain fill from another process already evicted them; the control is
    printed, the flush's result asserted.)"""
    import math
    import statistics
    import subprocess
    import sys

    from tasks import drive

    device = torch.device("cuda")
    holder = subprocess.Popen(
        [sys.executable, "-c", L2_HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    ratios: dict[tuple[str, str], list[float]] = {}
    try:
        size = int(holder.stdout.readline())
        for round_ in range(96):  # the plain fills first: the flush takes the carve-out away for good
            kind = "plain fill" if round_ < 48 else "orchestrator's flush"
            order = ("held", "plain")[round_ % 2]
            if kind == "plain fill":
                drive._flush_buffer(str(device)).fill_(float(round_))
            else:
                drive._flush(device)
            torch.cuda.synchronize()
            holder.stdin.write(order + "\n")
            holder.stdin.flush()
            held_ms, plain_ms = map(float, holder.stdout.readline().split())
            if round_ % 48 >= 4:  # the first rounds of each kind set the lines up
                ratios.setdefault((kind, order), []).append(held_ms / plain_ms)
    finally:
        holder.kill()
        holder.wait()
    # the geometric mean of both orders' medians: a read's place after the spin does not count
    both = {
        kind: math.sqrt(statistics.median(ratios[kind, "held"]) * statistics.median(ratios[kind, "plain"]))
        for kind in ("plain fill", "orchestrator's flush")
    }
    print(f"{size >> 20} MiB held in persisting lines: its read time over a plain buffer's {both}")
    assert both["orchestrator's flush"] > 0.9, both
