"""The CUDA and Triton reference kernels verify and time on their smoke problems at the "gpu" size preset,
each through real isolated workers."""

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
SMOKE = ROOT / "data" / "problems" / "smoke"
BACKENDS = ("cuda", "triton")
REFERENCE_KERNELS = [
    (backend, path) for backend in BACKENDS for path in sorted((ROOT / "kernels_ref" / backend).glob("*.py"))
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_smoke_problem_has_a_reference_kernel(backend):
    kernels = sorted(p.stem for p in (ROOT / "kernels_ref" / backend).glob("*.py"))
    assert kernels == sorted(p.stem for p in SMOKE.glob("*.py"))


@pytest.mark.parametrize(
    ("backend", "kernel_path"), REFERENCE_KERNELS, ids=lambda v: v if isinstance(v, str) else v.stem
)
def test_reference_kernel_is_correct_and_timed(backend, kernel_path, config):
    gpu_config = config.model_copy(update={"backend": backend})  # GPU backends default to the "gpu" preset
    problem_source, kernel_source = (SMOKE / kernel_path.name).read_text(), kernel_path.read_text()

    verified = evaluate_in_worker("verify", problem_source, kernel_source, gpu_config)
    assert verified["outcome"] == "correct", verified
    timed = evaluate_in_worker("time", problem_source, kernel_source, gpu_config)
    assert timed["outcome"] == "correct", timed
    assert timed["runtime_ms"] > 0
