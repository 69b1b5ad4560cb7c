"""The compile stage runs the static pre-check first: a cheap rejection starts no worker."""

from pathlib import Path

from tasks.compile import compile_candidate
from tasks.problems import parse_problem

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = parse_problem(ROOT / "data" / "problems" / "smoke" / "1_relu.py")
LIBRARY_CALL = (
    "import torch\nimport torch.nn as nn\n\n"
    "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
)


def test_a_reference_op_is_refused_before_any_worker_unless_library_calls_are_allowed(config):
    refused = compile_candidate(PROBLEM, LIBRARY_CALL, config)
    assert (refused["outcome"], refused["error_class"], refused["rejected_by"]) == (
        "integrity_violation",
        "reference_op",
        "precheck",
    )
    assert "torch.relu" in refused["error_excerpt"] and "worker_s" not in refused

    allowed = compile_candidate(PROBLEM, LIBRARY_CALL, config.model_copy(update={"allow_library_calls": True}))
    assert allowed["outcome"] == "correct" and allowed["worker_s"] > 0
