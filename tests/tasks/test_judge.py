"""The parent's judge (tasks/judge.py): where the reference's outputs come from and how outputs reach it.

On the cpu backend outputs are files; on a GPU they stay on the device (CUDA IPC), and the verdicts
must not depend on the route."""

from pathlib import Path

import pytest
import torch

from tasks.judge import _references, evaluate_in_worker

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = (ROOT / "data" / "problems" / "smoke" / "1_relu.py").read_text()
no_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"
)


def test_the_baseline_worker_makes_the_reference_outputs_once(config):
    config = config.model_copy(update={"base_seed": 40417})  # settings no other test has used
    baseline = evaluate_in_worker("baseline", PROBLEM, None, config)
    assert baseline["outcome"] == "correct", baseline
    assert baseline["eager_ms"] > 0 and baseline["expected_s"] > 0
    assert "reference_ops" not in baseline and "handover" not in baseline  # kept by the judge, not recorded
    entry = _references._get(_references.key(PROBLEM, config))
    assert entry is not None and entry["worker_s"] == baseline["worker_s"]  # no separate reference worker
    assert entry["reference_ops"] == ["relu"] and entry["trials"] == config.correctness_trials

    again = evaluate_in_worker("baseline", PROBLEM, None, config)
    assert again["outcome"] == "correct" and "expected_s" not in again  # made once per problem and settings

    kernel = (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()
    assert evaluate_in_worker("compile", PROBLEM, kernel, config)["outcome"] == "correct"
    verified = evaluate_in_worker("verify", PROBLEM, kernel, config)
    assert verified["outcome"] == "correct", verified
    assert verified["trials"] == config.correctness_trials and verified["judge_s"] > 0
    assert _references._get(_references.key(PROBLEM, config)) is entry


@pytest.mark.gpu
@no_gpu
@pytest.mark.parametrize("handover", ["device", "files"])
def test_gpu_verdicts_do_not_depend_on_how_outputs_reach_the_judge(config, monkeypatch, handover):
    if handover == "files":
        monkeypatch.setenv("KFORGE_OUTPUT_HANDOVER", "files")
    gpu = config.model_copy(update={"backend": "cuda"})
    honest = (ROOT / "kernels_ref" / "cuda" / "1_relu.py").read_text()
    off_by_one = honest.replace(
        "lib.relu(x, y, x.numel())", "lib.relu(x, y, x.numel())\n        y.view(-1)[100] += 1.0"
    )
    assert evaluate_in_worker("compile", PROBLEM, honest, gpu)["outcome"] == "correct"

    verified = evaluate_in_worker("verify", PROBLEM, honest, gpu)
    timed = evaluate_in_worker("time", PROBLEM, honest, gpu)
    wrong = evaluate_in_worker("verify", PROBLEM, off_by_one, gpu)

    assert verified["outcome"] == "correct", verified
    assert verified["max_abs_err"] == 0.0 and "handover" not in verified
    assert timed["outcome"] == "correct" and timed["runtime_ms"] > 0, timed
    assert (wrong["outcome"], wrong["error_class"]) == ("numerical_mismatch", "values"), wrong
    assert "1 of 16777216 elements" in wrong["error_excerpt"] and "[[0, 100]]" in wrong["error_excerpt"]
    entry = _references._get(_references.key(PROBLEM, gpu))
    on_device = [t.is_cuda for t in entry["outputs"].values()]
    assert on_device == ([True] * (gpu.correctness_trials + 4) if handover == "device" else [])
