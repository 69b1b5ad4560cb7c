"""INTEGRITY.md rows caught at runtime on the CPU backend, each cheat beside an honest twin that passes.
(Other rows have their tests beside the code: tests/tasks/harness/test_worker.py, test_timing.py,
tests/tasks/test_precheck.py; the GPU rows in test_gpu_cheats.py.)"""

from pathlib import Path

from tasks.compile import compile_candidate
from tasks.isolate import evaluate_in_worker
from tasks.problems import parse_problem

ROOT = Path(__file__).resolve().parents[2]
RELU_PATH = ROOT / "data" / "problems" / "smoke" / "1_relu.py"
RELU = RELU_PATH.read_text()
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
COPY_KERNEL = '''
import torch
import torch.nn as nn
from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cstdint>
extern "C" void copy(const float* x, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = x[i]; }
""")

class ModelNew(nn.Module):
    def forward(self, x):
        {body}
'''


def candidate(body: str) -> str:
    header = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
    return f"{header}        {body}\n"


def test_row1_a_reference_op_reached_past_the_static_check_is_caught_when_it_runs(config):
    hidden = candidate('return getattr(torch, "re" + "lu")(x)')
    assert compile_candidate(parse_problem(RELU_PATH), hidden, config)["outcome"] == "correct"  # static: unseen
    caught = evaluate_in_worker("verify", RELU, hidden, config)
    assert (caught["outcome"], caught["error_class"]) == ("integrity_violation", "reference_op")
    assert "aten::relu" in caught["error_excerpt"]

    allowed = evaluate_in_worker("verify", RELU, hidden, config.model_copy(update={"allow_library_calls": True}))
    assert allowed["outcome"] == "correct"
    assert evaluate_in_worker("verify", RELU, HONEST_RELU, config)["outcome"] == "correct"


def test_row6_returning_an_input_where_the_reference_makes_new_memory(config):
    for cheat in ("return x", "return x.view(-1).view(x.shape)"):
        caught = evaluate_in_worker("verify", SCALE, candidate(cheat), config)
        assert (caught["outcome"], caught["error_class"]) == ("integrity_violation", "returns_input"), cheat

    honest = COPY_KERNEL.replace(
        "{body}", "y = torch.empty_like(x)\n        lib.copy(x, y, x.numel())\n        return y"
    )
    assert evaluate_in_worker("verify", SCALE, honest, config)["outcome"] == "correct"
