"""INTEGRITY.md rows that need a GPU: work hidden on a side stream, and an honest twin that must pass."""

from pathlib import Path

import pytest
import torch

from tasks.isolate import evaluate_in_worker

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


def test_work_hidden_on_a_side_stream_is_caught_and_the_honest_twin_is_timed(config):
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    honest = evaluate_in_worker("time", PROBLEM, relu_candidate(on_side_stream=False), gpu)
    assert honest["outcome"] == "correct", honest
    assert honest["sync_gap_ms"] < 0.03 and honest["runtime_ms"] > 0.2

    hidden = evaluate_in_worker("time", PROBLEM, relu_candidate(on_side_stream=True), gpu)
    assert (hidden["outcome"], hidden["error_class"]) == ("integrity_violation", "side_stream"), hidden
    assert "escapes the timing window" in hidden["error_excerpt"]
