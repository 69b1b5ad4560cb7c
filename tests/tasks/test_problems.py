"""The suite loader: KernelBench-format files are checked statically; bad files are reported, never fatal."""

from pathlib import Path

import pytest

from tasks.problems import load_suite

SMOKE = Path(__file__).resolve().parents[2] / "data" / "problems" / "smoke"

GOOD_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8)]


def get_init_inputs():
    return []
"""


def test_smoke_suite_loads_nine_problems_of_levels_one_to_three():
    problems, rejected = load_suite(SMOKE)

    assert rejected == []
    assert [p.problem_id for p in problems] == [
        "1_gelu",
        "1_layernorm",
        "1_matmul",
        "1_relu",
        "1_softmax",
        "1_sum_dim",
        "2_linear_relu",
        "2_linear_scale_sigmoid",
        "3_mlp",
    ]
    assert [p.level for p in problems] == [1, 1, 1, 1, 1, 1, 2, 2, 3]
    assert {p.suite for p in problems} == {"smoke"}
    assert all("class Model" in p.source and len(p.source_hash) == 16 for p in problems)


def test_malformed_files_are_rejected_with_their_reason_and_the_good_one_loads(write_source, tmp_path):
    write_source("suite/1_good.py", GOOD_PROBLEM)
    write_source("suite/2_syntax.py", "def get_inputs(:\n    return []\n")
    write_source("suite/3_no_inputs.py", GOOD_PROBLEM.replace("def get_inputs", "def make_inputs"))
    (tmp_path / "suite" / "4_junk.py").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00binary")
    # A helper module next to the problems: skipped, although it would be rejected as a problem.
    write_source("suite/_private.py", "HELPER = 1\n")

    problems, rejected = load_suite(tmp_path / "suite")

    assert [p.problem_id for p in problems] == ["1_good"]
    reasons = {Path(r.path).name: r.reason for r in rejected}
    assert reasons == {
        "2_syntax.py": "syntax error at line 1: invalid syntax",
        "3_no_inputs.py": "missing get_inputs (a KernelBench problem defines Model, get_inputs, get_init_inputs)",
        "4_junk.py": "not a UTF-8 text file",
    }
    # The line a user sees names the file first.
    for rejection in rejected:
        assert str(rejection) == f"{tmp_path / 'suite' / Path(rejection.path).name}: {rejection.reason}"


def test_kernelbench_layout_takes_the_level_from_the_directory_name(write_source, tmp_path):
    assert "LEVEL" not in GOOD_PROBLEM
    write_source("level1/19_ReLU.py", GOOD_PROBLEM)

    problems, rejected = load_suite(tmp_path / "level1")

    assert rejected == []
    [problem] = problems
    assert (problem.problem_id, problem.suite, problem.level) == ("19_ReLU", "level1", 1)


def test_problems_sort_by_their_number_not_as_text(write_source, tmp_path):
    for name in ("10_b.py", "2_a.py", "1_c.py", "extra.py"):
        write_source(f"suite/{name}", GOOD_PROBLEM)

    problems, _ = load_suite(tmp_path / "suite")

    assert [p.problem_id for p in problems] == ["1_c", "2_a", "10_b", "extra"]
    assert {p.level for p in problems} == {None}  # no LEVEL and no levelN directory


def test_absent_directory_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_suite"):
        load_suite(tmp_path / "no_such_suite")
