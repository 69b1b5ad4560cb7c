"""The NVRTC fast path: device code compiles to a cubin without a GPU, the cubin is cached, a compile
error carries NVRTC's log (also through the worker), and on a GPU kernels launch on torch's current
stream with arguments converted by parameter size."""

from pathlib import Path

import pytest
import torch

from kforge.kernels import CompileError, load_cuda_kernels
from tasks.harness import nvrtc
from tasks.judge import evaluate_in_worker
from tasks.precheck import precheck


def nvrtc_missing() -> bool:
    try:
        nvrtc.nvrtc_library()
    except OSError:
        return True
    return False


pytestmark = pytest.mark.skipif(nvrtc_missing(), reason="libnvrtc not found: pip install nvidia-cuda-nvrtc")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

ROOT = Path(__file__).resolve().parents[3]
RELU_PROBLEM = (ROOT / "data" / "problems" / "smoke" / "1_relu.py").read_text()
# What nvcc's implicit includes give kernels and NVRTC lacks: <cstdint>, int64_t, INFINITY.
SOURCE = r"""
#include <cstdint>
#include <cmath>
extern "C" __global__ void relu(const float* x, float* y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f && x[i] < INFINITY ? x[i] : 0.f;
}
// Writes what it was given, to check the argument conversion by parameter size.
extern "C" __global__ void echo(double* out, int small, long long big, float f, double d, unsigned char byte) {
    out[0] = small; out[1] = (double)big; out[2] = f; out[3] = d; out[4] = byte;
}
// Dynamic shared memory beyond the 48 KiB default: every thread stages its value through it.
extern "C" __global__ void through_shared(const float* x, float* y, int stride) {
    extern __shared__ float staged[];
    staged[threadIdx.x * stride] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = staged[threadIdx.x * stride];
}
"""
CANDIDATE = '''
import torch
import torch.nn as nn

from kforge.kernels import load_cuda_kernels

kernels = load_cuda_kernels(r"""
extern "C" __global__ void relu(const float* x, float* y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
""")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        kernels.relu(grid=(x.numel() + 255) // 256, block=256, args=(x, y, x.numel()))
        return y
'''


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory) -> Path:
    """One empty cache for this module's direct compiles: the first test fills it, later ones hit it."""
    cache = tmp_path_factory.mktemp("nvrtc-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KFORGE_KERNEL_CACHE", str(cache))
        yield cache


def test_cubin_compiles_without_a_gpu_and_is_cached_by_source_and_arch(kernel_cache, monkeypatch):
    monkeypatch.delenv("KFORGE_CUDA_ARCH", raising=False)
    first = nvrtc.compile_cubin(SOURCE)
    assert first.parent == kernel_cache / "nvrtc" and first.suffix == ".cubin"
    assert first.read_bytes()[:4] == b"\x7fELF"  # a cubin (SASS), not PTX text

    def no_compiler(*args, **kwargs):
        raise AssertionError("NVRTC ran although the cubin is cached")

    with monkeypatch.context() as patched:
        patched.setattr(nvrtc, "_nvrtc_compile", no_compiler)
        assert nvrtc.compile_cubin(SOURCE) == first
        assert load_cuda_kernels(SOURCE).path == first
    assert [p.name for p in (kernel_cache / "nvrtc").iterdir()] == [first.name]  # no partial files left

    if not torch.cuda.is_available():  # with a GPU its capability decides the arch, not the variable
        monkeypatch.setenv("KFORGE_CUDA_ARCH", "sm_80")
        assert nvrtc.compile_cubin(SOURCE) != first


def test_nvrtc_error_is_a_compile_error_with_the_nvrtc_log(kernel_cache):
    with pytest.raises(CompileError) as error:
        nvrtc.compile_cubin(SOURCE.replace("if (i < n) y[i]", "if (i < n) out[i]"))

    assert 'kernel.cu(6): error: identifier "out" is undefined' in str(error.value)  # the candidate's own lines


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the kernel launches")
def test_launch_without_a_gpu_raises_naming_the_kernel(kernel_cache):
    kernels = load_cuda_kernels(SOURCE)

    with pytest.raises(RuntimeError, match="kernel relu cannot launch: no CUDA GPU"):
        kernels.relu(grid=1, block=32, args=(torch.zeros(1), torch.zeros(1), 1))


def test_precheck_accepts_a_candidate_using_the_helper():
    assert precheck(CANDIDATE, RELU_PROBLEM) is None


def test_worker_records_an_nvrtc_error_as_compile_error(config):
    broken = CANDIDATE.replace("y[i] = x[i]", "y[i] = x[i")

    result = evaluate_in_worker("compile", RELU_PROBLEM, broken, config.model_copy(update={"backend": "cuda"}))

    assert (result["outcome"], result["error_class"]) == ("compile_error", "CompileError"), result
    assert 'kernel.cu(4): error: expected a "]"' in result["error_excerpt"], result


# ---- on a GPU ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernels(kernel_cache):
    return load_cuda_kernels(SOURCE)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("n", [1, 1000, 1 << 20])
def test_relu_launches_on_the_current_stream_and_matches_torch(kernels, n):
    x, source = torch.zeros(n, device="cuda"), torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())

    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # keeps the side stream busy for milliseconds
        x.copy_(source)  # a kernel launched on any other stream would read x before this lands
        kernels.relu(grid=(n + 255) // 256, block=(256,), args=(x, y, n))
    side.synchronize()

    assert torch.equal(y, torch.relu(source))


@pytest.mark.gpu
@needs_gpu
def test_arguments_are_converted_by_parameter_size(kernels):
    out = torch.zeros(5, dtype=torch.float64, device="cuda")

    kernels.echo(grid=1, block=1, args=(out, -7, 2**40 + 3, 0.1, 0.1, 255))

    assert out.tolist() == [-7.0, float(2**40 + 3), float(torch.tensor(0.1, dtype=torch.float32)), 0.1, 255.0]
    with pytest.raises(TypeError, match="kernel echo takes 6 arguments, got 5"):
        kernels.echo(grid=1, block=1, args=(out, 1, 2, 3.0, 4.0))
    with pytest.raises(TypeError, match="kernel echo argument 1: 4294967296 does not fit its 4-byte parameter"):
        kernels.echo(grid=1, block=1, args=(out, 2**32, 2, 3.0, 4.0, 5))
    with pytest.raises(TypeError, match="kernel echo argument 0: a tensor must be contiguous and on the GPU"):
        kernels.echo(grid=1, block=1, args=(out.cpu(), 1, 2, 3.0, 4.0, 5))
    with pytest.raises(AttributeError, match='no kernel missing in the cubin: declare it extern "C" __global__'):
        kernels.missing  # noqa: B018


@pytest.mark.gpu
@needs_gpu
def test_dynamic_shared_memory_above_48_kib_is_opted_in(kernels):
    x = torch.randn(128, device="cuda")
    y = torch.zeros_like(x)
    stride = 128  # 128 threads * 128 floats apart * 4 bytes = 64 KiB

    kernels.through_shared(grid=1, block=128, args=(x, y, stride), shared_mem=128 * stride * 4)
    torch.cuda.synchronize()

    assert torch.equal(y, x)


@pytest.mark.gpu
@needs_gpu
def test_launch_failure_raises_naming_the_kernel(kernels):
    x = torch.randn(4096, device="cuda")

    with pytest.raises(RuntimeError, match="CUDA error launching kernel relu: .*CUDA_ERROR_INVALID_VALUE"):
        kernels.relu(grid=2, block=2048, args=(x, torch.empty_like(x), x.numel()))  # too many threads per block


@pytest.mark.gpu
@needs_gpu
def test_candidate_using_the_helper_is_correct_through_the_worker(config):
    result = evaluate_in_worker("verify", RELU_PROBLEM, CANDIDATE, config.model_copy(update={"backend": "cuda"}))

    assert result["outcome"] == "correct", result
