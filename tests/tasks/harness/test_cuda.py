"""The CUDA fast path without a GPU: nvcc builds into the kernel cache, a compile error carries nvcc's
log, launchers get the stream appended, and the worker's compile stage builds every CUDA reference kernel."""

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kforge.kernels import CompileError, load_cuda
from tasks.harness import cpu
from tasks.harness.cuda import compile_cuda
from tasks.judge import evaluate_in_worker

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: nothing can compile CUDA")

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "data" / "problems" / "smoke"
CUDA_KERNELS = sorted((ROOT / "kernels_ref" / "cuda").glob("*.py"))

SOURCE = r"""
#include <cstdint>
__global__ void scale_kernel(const float* x, float* y, int64_t n, float factor) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = factor * x[i];
}
extern "C" void scale(const float* x, float* y, int64_t n, double factor, cudaStream_t stream) {
    scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n, (float)factor);
}
// Host code only, so a machine without a GPU can call it; y[n] records whether the stream was null.
extern "C" void host_scale(const float* x, float* y, int64_t n, double factor, cudaStream_t stream) {
    for (int64_t i = 0; i < n; ++i) y[i] = (float)(factor * x[i]);
    y[n] = stream == nullptr ? 1.f : -1.f;
}
"""


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory) -> Path:
    """One empty cache for this module's direct compiles: the first test fills it, later ones hit it."""
    cache = tmp_path_factory.mktemp("cuda-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KFORGE_KERNEL_CACHE", str(cache))
        yield cache


def test_compiled_object_is_cached_by_source_and_arch(kernel_cache, monkeypatch):
    monkeypatch.delenv("KFORGE_CUDA_ARCH", raising=False)
    assert not (kernel_cache / "cuda").exists()
    first = compile_cuda(SOURCE)
    assert first.parent == kernel_cache / "cuda" and first.suffix == ".so"

    def no_compiler(*args, **kwargs):
        raise AssertionError(f"ran {args[0]} although the artifact is cached")

    with monkeypatch.context() as patched:
        patched.setattr(cpu.subprocess, "run", no_compiler)
        assert compile_cuda(SOURCE) == first
    assert sorted(p.name for p in (kernel_cache / "cuda").iterdir()) == [first.name]  # no build leftovers

    if not torch.cuda.is_available():  # with a GPU its capability decides the arch, not the variable
        monkeypatch.setenv("KFORGE_CUDA_ARCH", "sm_80")
        assert compile_cuda(SOURCE) != first


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, launchers take CUDA tensors only")
def test_host_function_gets_tensor_pointers_int64_double_and_a_null_stream(kernel_cache):
    lib = load_cuda(SOURCE)
    x = torch.randn(5)
    y = torch.zeros(6)

    lib.host_scale(x, y, 5, 3.0)

    assert torch.equal(y[:5], (3.0 * x.double()).float())
    assert y[5] == 1.0  # the appended stream argument arrived, and without a GPU it is null
    with pytest.raises(TypeError, match="cuda kernel given a non-contiguous tensor"):
        lib.host_scale(torch.randn(4, 4).t(), y, 16, 1.0)
    with pytest.raises(TypeError, match="cuda kernel argument of type str"):
        lib.host_scale(x, y, "5", 1.0)


def test_nvcc_error_is_a_compile_error_with_the_nvcc_log(kernel_cache):
    with pytest.raises(CompileError) as error:
        load_cuda(SOURCE.replace("if (i < n) y[i]", "if (i < n) out[i]"))

    assert 'kernel.cu(5): error: identifier "out" is undefined' in str(error.value)
    assert str(kernel_cache) not in str(error.value)  # the build directory is not shown


@pytest.mark.slow  # nine workers, nine nvcc builds: about 30 s on 2 cores
def test_worker_compile_stage_builds_every_cuda_reference_kernel(config):
    cuda_config = config.model_copy(update={"backend": "cuda"})

    def compile_stage(kernel_path: Path) -> dict:
        problem_source = (SMOKE / kernel_path.name).read_text()
        return evaluate_in_worker("compile", problem_source, kernel_path.read_text(), cuda_config)

    with ThreadPoolExecutor(max_workers=2) as pool:  # nvcc and worker start-up are each mostly one core
        results = dict(zip([p.stem for p in CUDA_KERNELS], pool.map(compile_stage, CUDA_KERNELS)))

    assert sorted(results) == sorted(p.stem for p in SMOKE.glob("*.py"))
    assert {stem: r["outcome"] for stem, r in results.items()} == dict.fromkeys(results, "correct"), results


def test_worker_records_an_nvcc_error_as_compile_error(config):
    relu = ROOT / "kernels_ref" / "cuda" / "1_relu.py"
    broken = relu.read_text().replace("relu_kernel<<<", "relu_kernel<<")

    result = evaluate_in_worker(
        "compile", (SMOKE / "1_relu.py").read_text(), broken, config.model_copy(update={"backend": "cuda"})
    )

    assert (result["outcome"], result["error_class"]) == ("compile_error", "CompileError"), result
    assert "kernel.cu(" in result["error_excerpt"] and "error" in result["error_excerpt"]
