"""The profile stage under Nsight Compute on a GPU: the CUDA reference ReLU profiled by ncu in a
real isolated worker, its launches and speed-of-light metrics parsed into rows."""

import shutil

import pytest
import torch

from tasks import profile
from tasks.isolate import PROJECT_ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    ),
    pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu on PATH)"),
]

PROBLEM_SOURCE = (PROJECT_ROOT / "data/problems/smoke/1_relu.py").read_text()
CANDIDATE_SOURCE = (PROJECT_ROOT / "kernels_ref/cuda/1_relu.py").read_text()


def test_ncu_profiles_the_candidates_kernel(config):
    profiled = profile.profile_in_worker(
        PROBLEM_SOURCE, CANDIDATE_SOURCE, config.model_copy(update={"backend": "cuda"})
    )
    assert profiled["outcome"] == "correct", profiled
    assert profiled["tool"] == "ncu", profiled.get("warning")
    assert profiled["tool_version"][:4].isdigit()
    kernels = {row["kernel"] for row in profiled["rows"]}
    assert any("relu" in name.lower() for name in kernels), kernels
    metrics = {(row["section"], row["metric"]): row["value"] for row in profiled["rows"]}
    duration = [v for (section, metric), v in metrics.items() if metric == "Duration"]
    assert duration and all(v > 0 for v in duration)
    throughput = [
        v
        for (section, metric), v in metrics.items()
        if metric == "Memory Throughput" and section == "GPU Speed Of Light Throughput"
    ]
    assert throughput and 0 < throughput[0] <= 100  # % of peak


def test_ncu_profiles_the_reference(config):
    profiled = profile.profile_in_worker(
        PROBLEM_SOURCE, None, config.model_copy(update={"backend": "cuda"}), model="reference"
    )
    assert profiled["outcome"] == "correct", profiled
    assert profiled["tool"] == "ncu", profiled.get("warning")
    assert len({row["instance"] for row in profiled["rows"]}) >= 1
