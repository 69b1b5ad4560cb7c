"""The baseline stage: the reference timed eagerly and under torch.compile, a failing torch.compile
recorded beside the eager figures."""

from pathlib import Path

import pytest
import torch

from tasks.judge import evaluate_in_worker

PROBLEM = (Path(__file__).resolve().parents[2] / "data" / "problems" / "smoke" / "1_relu.py").read_text()


def test_the_reference_is_timed_eagerly_and_under_torch_compile(config):
    result = evaluate_in_worker("baseline", PROBLEM, None, config.model_copy(update={"torch_compile_baseline": True}))
    assert result["outcome"] == "correct", result
    assert result["eager_ms"] > 0 and result["compile_ms"] > 0, result
    assert result["torch_compile_error"] is None, result


def test_a_torch_compile_that_fails_on_its_first_call_keeps_the_eager_time(config, monkeypatch):
    """torch.compile is lazy: inductor builds on the first call, here with a C++ compiler that does
    not exist. That loses the compiled figure only, with the reason."""
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    result = evaluate_in_worker("baseline", PROBLEM, None, config.model_copy(update={"torch_compile_baseline": True}))
    assert result["outcome"] == "correct", result
    assert result["eager_ms"] > 0 and result.get("compile_ms") is None, result
    assert result["torch_compile_error"], result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
def test_on_a_gpu_the_compiled_baseline_is_timed_in_a_stage_of_its_own(config):
    gpu = config.model_copy(update={"backend": "cuda", "torch_compile_baseline": True})
    result = evaluate_in_worker("baseline", PROBLEM, None, gpu)
    assert result["outcome"] == "correct", result
    assert result["torch_compile_error"] is None, result["torch_compile_error"]
    assert result["eager_ms"] > 0 and result["compile_ms"] > 0, result
