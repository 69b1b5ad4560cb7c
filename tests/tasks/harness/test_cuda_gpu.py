"""The CUDA fast path's calling convention on a GPU: launchers get torch's current stream, and a
launch error raises at once, naming the launcher, also through the worker."""

from pathlib import Path

import pytest
import torch

from kforge.kernels import load_cuda
from tasks.judge import evaluate_in_worker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    ),
]

ROOT = Path(__file__).resolve().parents[3]
SOURCE = r"""
#include <cstdint>
__global__ void scale_kernel(const float* x, float* y, int64_t n, float factor) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = factor * x[i];
}
extern "C" void scale(const float* x, float* y, int64_t n, double factor, int64_t threads, cudaStream_t stream) {
    scale_kernel<<<(unsigned)((n + threads - 1) / threads), (unsigned)threads, 0, stream>>>(x, y, n, (float)factor);
}
// Copies the stream handle it was given into device memory.
extern "C" void record_stream(int64_t* out, cudaStream_t stream) {
    const int64_t handle = (int64_t)stream;
    cudaMemcpy(out, &handle, sizeof handle, cudaMemcpyHostToDevice);
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KFORGE_KERNEL_CACHE", str(tmp_path_factory.mktemp("cuda-cache")))
        yield load_cuda(SOURCE)


def test_launcher_gets_the_current_stream_and_computes(lib):
    x = torch.randn(10_000, device="cuda")
    y = torch.empty_like(x)
    handle = torch.zeros(1, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()

    with torch.cuda.stream(side):
        lib.record_stream(handle)
        lib.scale(x, y, x.numel(), 2.5, 256)
    side.synchronize()

    assert handle.item() == side.cuda_stream != torch.cuda.default_stream().cuda_stream
    assert torch.equal(y, x * 2.5)


def test_launch_error_raises_naming_the_launcher(lib):
    x = torch.randn(4096, device="cuda")
    with pytest.raises(RuntimeError, match="CUDA error after launcher scale: invalid"):
        lib.scale(x, torch.empty_like(x), x.numel(), 1.0, 2048)  # more threads per block than allowed
    with pytest.raises(TypeError, match="cuda kernel given a tensor on cpu"):
        lib.scale(x.cpu(), torch.empty_like(x), x.numel(), 1.0, 256)


def test_launch_error_in_forward_is_a_runtime_error_through_the_worker(config):
    relu = (ROOT / "kernels_ref" / "cuda" / "1_relu.py").read_text()
    too_many_threads = relu.replace("(n + 255) / 256), 256, 0, stream", "(n + 2047) / 2048), 2048, 0, stream")
    assert too_many_threads != relu
    problem = (ROOT / "data" / "problems" / "smoke" / "1_relu.py").read_text()

    result = evaluate_in_worker("verify", problem, too_many_threads, config.model_copy(update={"backend": "cuda"}))

    assert (result["outcome"], result["error_class"]) == ("runtime_error", "RuntimeError in forward"), result
    # CUDA 13 names it "invalid argument"; older releases "invalid configuration argument"
    assert "RuntimeError: CUDA error after launcher relu: invalid" in result["error_excerpt"]
