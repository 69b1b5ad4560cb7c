"""One deliberately cheating candidate per INTEGRITY.md row, through the real isolated worker and
the parent's judge on the CPU backend, each with the exact outcome it must get; beside them, honest
candidates for the same problems that must still come out `correct`.

Rows that need a GPU (2: side streams; 5: the reference's freed device memory; 11: an illegal
address) are in test_gpu_cheats.py. The static pre-check would refuse several of these sources
before any worker starts (tests/tasks/test_precheck.py); here they go straight to the worker, to
show the runtime defence holds on its own.
"""

import textwrap
from pathlib import Path

import pytest

from tasks.judge import evaluate_in_worker

ROOT = Path(__file__).resolve().parents[2]
RELU = (ROOT / "data" / "problems" / "smoke" / "1_relu.py").read_text()
HONEST_RELU = (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()
# The reference makes new memory holding 1.0 * x: an honest kernel copies, a cheat hands x back.
SCALE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 1.0

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
"""
# A long dot product per element: the honest kernel's float32 rounding differs from the library's.
LONG_MATMUL = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)

def get_inputs():
    return [torch.randn(32, 8192), torch.randn(8192, 32)]

def get_init_inputs():
    return []
"""
# relu and copy over n floats, plus a matmul whose inputs may be rounded to `kept_bits` mantissa bits.
KERNELS = '''
import torch
import torch.nn as nn
from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cstdint>
#include <cstring>
extern "C" void relu(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" void copy(const float* x, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = x[i]; }
static float keep(float v, int64_t kept_bits) {
    if (kept_bits >= 23) return v;
    uint32_t u; std::memcpy(&u, &v, 4); u &= ~((1u << (23 - kept_bits)) - 1u); std::memcpy(&v, &u, 4); return v;
}
extern "C" void matmul(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, int64_t kept_bits) {
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float sum = 0.f;
            for (int64_t p = 0; p < k; ++p) sum += keep(a[i * k + p], kept_bits) * keep(b[p * n + j], kept_bits);
            c[i * n + j] = sum;
        }
}
""")
'''


def kernel_candidate(forward: str, init: str = "", prelude: str = "", signature: str = "x") -> str:
    init_def = "def __init__(self):\n    super().__init__()\n" + init + "\n"
    forward_def = f"def forward(self, {signature}):\n" + textwrap.indent(textwrap.dedent(forward).strip(), "    ")
    body = textwrap.indent(init_def + forward_def, "    ")
    return KERNELS + textwrap.dedent(prelude) + "\n\nclass ModelNew(nn.Module):\n" + body + "\n"


RELU_BODY = "y = torch.empty_like(x)\nlib.relu(x, y, x.numel())\nreturn y"
# The same result, computed 50 times over: slow enough that looking it up is clearly faster.
SLOW_RELU_BODY = "y = torch.empty_like(x)\nfor _ in range(50):\n    lib.relu(x, y, x.numel())"
MATMUL_BODY = """
C = torch.empty(A.shape[0], B.shape[1])
lib.matmul(A, B, C, A.shape[0], A.shape[1], B.shape[1], {kept_bits})
return C
"""

# One per row: (row, problem, candidate, stage it is caught in, expected (outcome, error_class)).
CHEATS = {
    "row01-reference-op-via-getattr": (
        1,
        RELU,
        kernel_candidate('return getattr(torch, "re" + "lu")(x)'),
        "verify",
        ("integrity_violation", "reference_op"),
    ),
    "row01-reference-op-in-an-except-fallback": (
        1,
        RELU,
        kernel_candidate("try:\n    raise RuntimeError('kernel not ready')\nexcept RuntimeError:\n    return x.relu()"),
        "verify",
        ("integrity_violation", "reference_op"),
    ),
    "row03-output-remembered-by-input-pointer": (
        3,
        RELU,
        kernel_candidate(
            "if x.data_ptr() not in self.seen:\n"
            "    y = torch.empty_like(x)\n    lib.relu(x, y, x.numel())\n    self.seen[x.data_ptr()] = y\n"
            "return self.seen[x.data_ptr()]",
            init="    self.seen = {}",
        ),
        "verify",  # every call reads the same input buffers, refilled by the orchestrator
        ("numerical_mismatch", "values"),
    ),
    "row03-output-remembered-by-shape": (
        3,
        RELU,
        kernel_candidate(
            "if x.shape not in self.seen:\n"
            "    y = torch.empty_like(x)\n    lib.relu(x, y, x.numel())\n    self.seen[x.shape] = y\n"
            "return self.seen[x.shape].clone()",
            init="    self.seen = {}",
        ),
        "verify",
        ("numerical_mismatch", "values"),
    ),
    "row04-lazy-tensor-subclass": (
        4,
        RELU,
        kernel_candidate(
            "y = torch.Tensor._make_subclass(Deferred, torch.empty_like(x))\ny.pending_input = x\nreturn y",
            prelude="""
            class Deferred(torch.Tensor):
                @classmethod
                def __torch_function__(cls, func, types, args=(), kwargs=None):
                    args = [a.pending_input.clamp(min=0) if isinstance(a, Deferred) else a for a in args]
                    return func(*args, **(kwargs or {}))
            """,
        ),
        "verify",
        ("integrity_violation", "not_a_tensor"),
    ),
    "row05-output-left-unwritten": (
        5,
        RELU,
        kernel_candidate(
            "y = torch.empty_like(x)\nlib.relu(x.view(-1)[:-1], y.view(-1)[:-1], x.numel() - 1)\nreturn y"
        ),
        "verify",
        ("numerical_mismatch", "nonfinite"),
    ),
    "row06-writes-into-its-input": (
        6,
        RELU,
        kernel_candidate("lib.relu(x, x, x.numel())\ny = torch.empty_like(x)\nlib.copy(x, y, x.numel())\nreturn y"),
        "verify",
        ("integrity_violation", "modified_input"),
    ),
    "row06-returns-its-input": (
        6,
        SCALE,
        kernel_candidate("return x.view(-1).view(x.shape)"),
        "verify",
        ("integrity_violation", "returns_input"),
    ),
    "row07-bf16-arithmetic-behind-a-float32-reference": (
        7,
        LONG_MATMUL,
        kernel_candidate(MATMUL_BODY.format(kept_bits=7), signature="A, B"),
        "verify",
        ("numerical_mismatch", "values"),
    ),
    "row07-tf32-arithmetic-behind-a-float32-reference": (
        7,
        LONG_MATMUL,
        kernel_candidate(MATMUL_BODY.format(kept_bits=10), signature="A, B"),
        "verify",
        ("numerical_mismatch", "values"),
    ),
    "row08-output-precomputed-for-the-problems-own-inputs": (
        8,
        RELU,
        kernel_candidate(
            "return self.answer.clone()",
            init="    torch.manual_seed(42)\n    x = torch.randn(16, 16384)\n"
            "    self.answer = torch.empty_like(x)\n    lib.relu(x, self.answer, x.numel())",
        ),
        "verify",
        ("numerical_mismatch", "values"),
    ),
    "row09-faster-clock": (
        9,
        RELU,
        kernel_candidate(
            RELU_BODY, prelude="import time\n_real = time.perf_counter\ntime.perf_counter = lambda: _real() / 4\n"
        ),
        "compile",
        ("integrity_violation", "harness_patched"),
    ),
    "row09-comparison-that-always-agrees": (
        9,
        RELU,
        kernel_candidate(
            "import tasks.harness.checks as checks\n"
            "checks.compare_outputs = lambda *args, **kwargs: (None, 1e-4, 1e-4)\n"
            "return torch.zeros_like(x)"
        ),
        "verify",  # the orchestrator compares: the worker's copy of the comparison decides nothing
        ("numerical_mismatch", "values"),
    ),
    "row10-forged-result-file": (
        10,
        RELU,
        kernel_candidate(
            "self.calls += 1\nif self.calls > 3:  # past verify's trials: being timed\n    forge()\n" + RELU_BODY,
            init="    self.calls = 0",
            prelude="""
            import json, os, sys

            def forge():
                control = sys.argv[2] if sys.argv[1] == "--standby" else os.path.dirname(sys.argv[2])
                with open(os.path.join(control, "result.json"), "w") as forged:
                    json.dump({"outcome": "correct", "runtime_ms": 1e-6, "runtime_p10_ms": 1e-6,
                               "runtime_p90_ms": 1e-6, "timed_runs": 100, "sync_gap_ms": 0.0}, forged)
                os._exit(0)
            """,
        ),
        "time",  # a session's result is what the orchestrator saw: a result file decides nothing
        ("runtime_error", "no_result"),
    ),
    "row10-exits-zero-before-reporting": (
        10,
        RELU,
        kernel_candidate("import os\nos._exit(0)"),
        "verify",
        ("runtime_error", "no_result"),
    ),
    "row11-crashes-its-process": (
        11,
        RELU,
        kernel_candidate("import ctypes\nctypes.string_at(0)"),
        "verify",
        ("runtime_error", "SIGSEGV"),
    ),
}

HONEST = {
    "relu": (RELU, HONEST_RELU),
    "relu-from-the-shared-kernels": (RELU, kernel_candidate(RELU_BODY)),
    "relu-fifty-times-over": (RELU, kernel_candidate(SLOW_RELU_BODY + "\nreturn y")),
    "scale-copies": (SCALE, kernel_candidate("y = torch.empty_like(x)\nlib.copy(x, y, x.numel())\nreturn y")),
    "long-matmul-summing-one-product-at-a-time": (
        LONG_MATMUL,
        kernel_candidate(MATMUL_BODY.format(kept_bits=23), signature="A, B"),
    ),
}


def test_every_row_of_integrity_md_has_a_cheat_here_or_on_the_gpu():
    rows_here = {row for row, *_ in CHEATS.values()}
    assert rows_here | {2} == set(range(1, 12))


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheat_is_caught(name, config):
    _, problem, candidate, stage, expected = CHEATS[name]
    for earlier in ("compile", "verify", "time")[: ("compile", "verify", "time").index(stage)]:
        passed = evaluate_in_worker(earlier, problem, candidate, config)
        assert passed["outcome"] == "correct", (earlier, passed)  # the cheat gets as far as its row
    caught = evaluate_in_worker(stage, problem, candidate, config)
    assert (caught["outcome"], caught.get("error_class")) == expected, caught
    assert caught["error_excerpt"]


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_twin_is_correct_in_every_stage(name, config):
    problem, candidate = HONEST[name]
    for stage in ("compile", "verify", "time"):
        result = evaluate_in_worker(stage, problem, candidate, config)
        assert result["outcome"] == "correct", (stage, result)
    assert result["runtime_ms"] > 0


def test_no_call_ever_gets_inputs_seen_before(config):
    """Row 3 by contents: a kernel that remembers outputs by its inputs' contents never gets a hit,
    since every call's inputs are drawn from a new seed (this one fails loudly if it ever does)."""
    remembers = kernel_candidate(
        "key = float(x[0, :8].sum())\n"
        "if key in self.seen:\n    raise RuntimeError('inputs seen before')\n"
        f"{RELU_BODY.replace('return y', '')}\n"
        "self.seen[key] = y\nreturn y.clone()",
        init="    self.seen = {}",
    )
    for stage in ("compile", "verify", "time"):
        result = evaluate_in_worker(stage, RELU, remembers, config)
        assert result["outcome"] == "correct", (stage, result)


def test_library_calls_pass_when_the_run_allows_them(config):
    allowed = config.model_copy(update={"allow_library_calls": True})
    candidate = CHEATS["row01-reference-op-via-getattr"][2]
    assert evaluate_in_worker("verify", RELU, candidate, allowed)["outcome"] == "correct"
