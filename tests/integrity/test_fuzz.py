"""Malformed candidates through the precheck and the real isolated worker (1_relu, cpu backend).

Whatever the junk, nothing escapes as an exception, every answer is one of the eight outcomes and
never `correct`, and every answer says why. One worker call per case: the mode is the stage the
case should fail in, and a case that unexpectedly compiles is verified as well.
"""

import random
from pathlib import Path

import pytest

from kforge.results import OUTCOMES
from tasks.judge import evaluate_in_worker
from tasks.precheck import precheck

PROBLEM = (Path(__file__).resolve().parents[2] / "data" / "problems" / "smoke" / "1_relu.py").read_text()
HEAD = "import torch\nimport torch.nn as nn\n\n\n"


def model_new(forward: str = "return x", init: str = "def __init__(self):\n    super().__init__()") -> str:
    """A ModelNew with the given __init__ and forward bodies (forward is indented under `def forward(self, x)`)."""
    forward_def = "def forward(self, x):\n" + "".join(f"    {line}\n" for line in forward.splitlines())
    body = "".join(f"    {line}\n" for line in (init + "\n\n" + forward_def).splitlines())
    return HEAD + "class ModelNew(nn.Module):\n" + body


def junk(seed: int, size: int = 4096) -> str:
    """Random bytes read as UTF-8 with replacement characters, NUL bytes dropped (nul_byte has its own case)."""
    return random.Random(seed).randbytes(size).decode(errors="replace").replace("\x00", "")


# name -> (candidate source, the worker mode where it should fail)
CASES = {
    "syntax_error": (HEAD + "class ModelNew(nn.Module)\n    def forward(self, x) return x\n", "compile"),
    "missing_model_new": (HEAD + "class Model(nn.Module):\n    def forward(self, x):\n        return x\n", "compile"),
    "model_new_not_a_class": (HEAD + "ModelNew = 42\n", "compile"),
    "model_new_a_function": (HEAD + "def ModelNew():\n    return None\n", "compile"),
    "raises_at_import": (HEAD + "raise RuntimeError('broken on purpose')\n" + model_new(), "compile"),
    "nul_byte": (model_new().replace("return x", "return x\x00"), "compile"),
    "binary_junk": (junk(1), "compile"),
    "binary_junk_after_valid_code": (model_new() + junk(2), "compile"),
    "deeply_nested_parentheses": (model_new("return " + "(" * 500 + "x" + ")" * 500), "compile"),
    "wrong_init_signature": (model_new(init="def __init__(self, a, b, c):\n    super().__init__()"), "verify"),
    "init_not_calling_super": (
        model_new(init="def __init__(self):\n    self.w = nn.Parameter(torch.ones(1))"),
        "verify",
    ),
    "wrong_forward_signature": (model_new().replace("def forward(self, x)", "def forward(self)"), "verify"),
    "forward_returns_none": (model_new("x.clamp(min=0)"), "verify"),
    "forward_returns_a_list": (model_new("return [x.clamp(min=0)]"), "verify"),
    "forward_returns_a_huge_tensor": (model_new("return torch.empty(10**10)"), "verify"),
    "one_megabyte_source": (
        model_new("return x") + "".join(f"_padding_{i} = {'x' * 90!r}\n" for i in range(10_000)),
        "verify",
    ),
}


def assert_failed_with_a_reason(result: dict, where: str) -> None:
    assert result["outcome"] in OUTCOMES, f"{where}: {result}"
    assert result["outcome"] != "correct", f"{where}: {result}"
    assert result.get("error_excerpt"), f"{where} gave no reason: {result}"


def test_the_sources_are_as_large_and_as_broken_as_named():
    assert len(CASES["one_megabyte_source"][0]) >= 1_000_000
    assert "\x00" in CASES["nul_byte"][0]
    assert "\ufffd" in CASES["binary_junk"][0]
    assert "\x00" not in CASES["binary_junk"][0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_candidate_fails_cleanly_in_precheck_and_worker(name, config):
    source, mode = CASES[name]

    prechecked = precheck(source, PROBLEM)
    if prechecked is not None:
        assert_failed_with_a_reason(prechecked, "precheck")
    result = evaluate_in_worker(mode, PROBLEM, source, config)
    if mode == "compile" and result["outcome"] == "correct":  # it compiled after all: it must fail verification
        result = evaluate_in_worker("verify", PROBLEM, source, config)

    assert_failed_with_a_reason(result, f"worker ({mode})")
    if prechecked is not None and prechecked["outcome"] == "compile_error":  # the precheck mirrors the worker
        assert (result["outcome"], result["error_class"]) == (prechecked["outcome"], prechecked["error_class"])
