"""A load_inline CUDA source split into its kernels (nvcc) and its host code (g++ with the
precompiled torch/extension.h), and the shapes it leaves alone."""

import shutil
import subprocess
from pathlib import Path

import pytest

from tasks.harness.cuda_split import LAUNCH_PREFIX, split

# The shape of KernelBench's examples: torch/extension.h, a kernel, a host function launching it.
TILED = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#define TILE 16  // tile width
struct Shape { int rows; int cols; };
constexpr int kUnroll = 4;
constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ float twice(float v) { return 2.f * v; }

/* a kernel with a braced loop, a pragma inside and a struct argument */
__global__ void scaled_matmul_kernel(const float* __restrict__ A, const float* B, float* C, Shape s, int K) {
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.f;
#pragma unroll 4
    for (int k = 0; k < K; ++k) { sum += A[row * K + k] * B[k * s.cols + col]; }
    if (row < s.rows && col < s.cols) C[row * s.cols + col] = twice(sum) / kUnroll;
}

__global__ void fill_kernel(float* out, float value, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}

torch::Tensor scaled_matmul(torch::Tensor A, torch::Tensor B, int64_t block = 256) {
    TORCH_CHECK(A.is_cuda(), "A must be on the GPU");
    Shape s{(int)A.size(0), (int)B.size(1)};
    auto C = torch::empty({s.rows, s.cols}, A.options());
    dim3 threads(TILE, TILE), blocks((s.cols + TILE - 1) / TILE, (s.rows + TILE - 1) / TILE);
    fill_kernel<<<cdiv(C.numel(), block), block>>>(C.data_ptr<float>(), 0.f, C.numel());
    scaled_matmul_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), s, (int)A.size(1));
    return C;
}
"""


def test_kernels_go_to_nvcc_and_host_code_to_main_cpp():
    kernels, host = split(TILED)
    # the kernels' half: device code, types and macros, one launch function per kernel; no torch
    assert "__global__ void scaled_matmul_kernel" in kernels and "__global__ void fill_kernel" in kernels
    assert "__device__ __forceinline__ float twice" in kernels
    assert "#pragma unroll 4" in kernels.split("__global__ void scaled_matmul_kernel")[1]
    assert "struct Shape" in kernels and "#define TILE 16" in kernels and "constexpr int kUnroll" in kernels
    assert "constexpr int cdiv" in kernels and "constexpr int cdiv" in host  # either half may call it
    assert "torch" not in kernels.replace("kforge", "") and "TORCH_CHECK" not in kernels
    assert f"void {LAUNCH_PREFIX}fill_kernel(dim3 grid, dim3 block, size_t shared, cudaStream_t stream," in kernels
    assert "fill_kernel<<<grid, block, shared, stream>>>(out, value, n);" in kernels
    # the host half: torch's headers, the same types, declared launch functions, no launch syntax
    assert "#include <torch/extension.h>" in host and "struct Shape" in host and "__global__" not in host
    assert "<<<" not in host and "twice" not in host
    launch = f"{LAUNCH_PREFIX}fill_kernel(dim3(cdiv(C.numel(), block)), dim3(block), (size_t)(0), (cudaStream_t)(0), "
    assert launch in host
    # the stream the candidate gave is the one its kernel runs on
    assert "(cudaStream_t)(at::cuda::getCurrentCUDAStream()), A.data_ptr<float>()" in " ".join(host.split())
    assert (
        host.index("TORCH_CHECK")
        < host.index(f"{LAUNCH_PREFIX}fill_kernel(dim3(")
        < host.index(f"{LAUNCH_PREFIX}scaled_matmul_kernel(dim3(blocks)")
    )


@pytest.mark.parametrize(
    "change",
    [
        ("__global__ void fill_kernel(", "template <typename T>\n__global__ void fill_kernel("),
        ("#define TILE 16", "#ifndef TILE\n#define TILE 16\n#endif"),
        ("fill_kernel<<<", "other_kernel<<<"),  # a launch of no kernel of this file
        ("if (i < n) out[i] = value;", "if (i < n) out[i] = value; // at::Half h;\n    c10::Half h;"),
        ("struct Shape", "namespace detail { int x; }\nstruct Shape"),
        ("scaled_matmul_kernel<<<blocks, threads, 0, at", "scaled_matmul_kernel<<<blocks, threads, 0, 0, at"),
        ("return C;\n}", "return C;\n"),  # braces that do not balance
    ],
    ids=[
        "templated kernel",
        "conditional compilation",
        "unknown launch",
        "torch in device code",
        "namespace",
        "five launch arguments",
        "unbalanced",
    ],
)
def test_shapes_it_cannot_split_safely_are_left_as_written(change):
    old, new = change
    assert old in TILED
    assert split(TILED.replace(old, new, 1)) is None


def test_a_source_without_a_launch_is_left_as_written():
    assert split("#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x) { return x; }\n") is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit) to build the kernels' half")
def test_the_kernels_half_builds_with_nvcc_behind_an_empty_torch_types_header(tmp_path: Path):
    """The kernels' half as load_inline writes cuda.cu (torch/types.h on top), with the empty header
    ahead of torch's: nvcc builds it without any of torch."""
    kernels, _ = split(TILED)
    shadow = tmp_path / "shadow"
    (shadow / "torch").mkdir(parents=True)
    (shadow / "torch" / "types.h").write_text("")
    source = tmp_path / "cuda.cu"
    source.write_text("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + kernels)
    from torch.utils import cpp_extension

    includes = [flag for path in cpp_extension.include_paths() for flag in ("-isystem", path)]
    command = ["nvcc", "-c", str(source), "-o", str(tmp_path / "cuda.o"), f"-I{shadow}", *includes, "-std=c++17"]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    assert (
        f"{LAUNCH_PREFIX}fill_kernel"
        in subprocess.run(["nm", "-C", str(tmp_path / "cuda.o")], capture_output=True, text=True).stdout
    )


RELU_PROBLEM = (Path(__file__).resolve().parents[3] / "data" / "problems" / "smoke" / "1_relu.py").read_text()
RELU_INLINE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_forward(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

module = load_inline(
    name="fast_relu",
    cpp_sources="torch::Tensor relu_forward(torch::Tensor x);",
    cuda_sources=cuda_src,
    functions=["relu_forward"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return module.relu_forward(x.contiguous())
'''


@pytest.mark.gpu
def test_a_split_build_is_correct_on_the_gpu(config, monkeypatch, tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    from torch.utils import cpp_extension

    from tasks.harness import extensions
    from tasks.judge import evaluate_in_worker

    # here first, so a failing build shows its compiler's message
    kernels, host = split(RELU_INLINE.split('cuda_src = r"""')[1].split('"""')[0])
    arguments = {
        "name": "split_relu_here",
        "cpp_sources": ["torch::Tensor relu_forward(torch::Tensor x);", host],
        "cuda_sources": kernels,
        "functions": ["relu_forward"],
        "build_directory": str(tmp_path),
    }
    module = cpp_extension.load_inline(**extensions._with_shadow(arguments))
    x = torch.randn(1 << 20, device="cuda")
    assert torch.equal(module.relu_forward(x), torch.relu(x))

    monkeypatch.setenv("KFORGE_INLINE_BUILD", "split")
    gpu = config.model_copy(update={"backend": "cuda", "allow_library_calls": True})
    result = evaluate_in_worker("verify", RELU_PROBLEM, RELU_INLINE, gpu)
    assert result["outcome"] == "correct", result
    # one build, the split one: a failed split would have left a second, lighter or as written
    builds = list((Path(gpu.cache_dir) / "kernels" / "torch_extensions").glob("fast_relu-*"))
    shadowed = [build for build in builds if (build / "kforge-shadow").is_dir()]
    assert len(builds) == 1 and shadowed, [(b.name, sorted(p.name for p in b.iterdir())) for b in builds]
