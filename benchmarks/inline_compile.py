"""Compile time of KernelBench-style `load_inline` candidates through kforge's compile stage, as
torch builds them (`plain`), with kforge's compatibility path (`fast`) and, on cuda, with the CUDA
source split into kernels and host code (`split`, KFORGE_INLINE_BUILD=split), side by side in one run.

    python benchmarks/inline_compile.py [--backend cuda|cpu] [--candidates 5] [--modes plain,fast,split]

Each candidate is written here in the shape of KernelBench's examples (a `cpp_src` declaration, a
`cuda_src` that includes `<torch/extension.h>`, `load_inline(name=..., functions=[...])` at module
level; on `--backend cpu` the kernel is C++ in `cpp_sources`). Every build runs in kforge's compile
stage (`tasks.judge.evaluate_in_worker("compile", ...)`: a sandboxed worker imports the candidate)
with a kernel cache of each path's own, which starts empty (the fast one holds only the precompiled
header, built once before the table, and timed): each candidate's sources are new to it, so torch
really builds (fast and split each precompile the header into their own cache first, timed).
Each path goes first in turn per candidate, one build at a time.
Rows: `compile_s` (the worker's import of the candidate: the build) and `stage_s` (the compile
stage's wall time, worker start included), then `again_s`: the same candidate's compile stage once
more over its own cache, what its verify and time stages pay.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kforge.config import RunConfig  # noqa: E402
from tasks.harness import extensions  # noqa: E402
from tasks.judge import evaluate_in_worker  # noqa: E402

UNARY_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {expression}


def get_inputs():
    return [torch.randn(1 << 20)]


def get_init_inputs():
    return []
"""

BINARY_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return {expression}


def get_inputs():
    return [torch.randn({shape_a}), torch.randn({shape_b})]


def get_init_inputs():
    return []
"""

CUDA_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

{kernel}
"""

cpp_src = "{declaration}"

module = load_inline(
    name="{name}",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["{function}"],
    verbose=False,
    extra_cflags=[""],
    extra_ldflags=[""],
)


class ModelNew(nn.Module):
    def forward(self, *inputs):
        return module.{function}(*[x.contiguous() for x in inputs])
'''

CPU_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_src = r"""
{kernel}
"""

module = load_inline(name="{name}", cpp_sources=cpp_src, functions=["{function}"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, *inputs):
        return module.{function}(*[x.contiguous() for x in inputs])
'''

ELEMENTWISE_CUDA = r"""
__global__ void {function}_kernel(const float* a, const float* b, float* out, int64_t n) {{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = {body};
}}

torch::Tensor {function}(torch::Tensor a, torch::Tensor b) {{
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;
    {function}_kernel<<<blocks, threads>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}}
"""

UNARY_CUDA = r"""
__global__ void {function}_kernel(const float* x, float* out, int64_t n) {{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {{ float v = x[i]; out[i] = {body}; }}
}}

torch::Tensor {function}(torch::Tensor x) {{
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    {function}_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}}
"""

MATMUL_CUDA = r"""
#define TILE 16
__global__ void {function}_kernel(const float* A, const float* B, float* C, int M, int K, int N) {{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {{
        int ak = t * TILE + threadIdx.x, bk = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) sum += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }}
    if (row < M && col < N) C[row * N + col] = sum;
}}

torch::Tensor {function}(torch::Tensor A, torch::Tensor B) {{
    int M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::zeros({{M, N}}, A.options());
    dim3 threads(TILE, TILE), blocks((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    {function}_kernel<<<blocks, threads>>>(A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), M, K, N);
    return C;
}}
"""

UNARY_CPU = r"""
torch::Tensor {function}(torch::Tensor x) {{
    auto out = torch::empty_like(x);
    const float* src = x.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {{ float v = src[i]; dst[i] = {body}; }}
    return out;
}}
"""

BINARY_CPU = r"""
torch::Tensor {function}(torch::Tensor a, torch::Tensor b) {{
    auto out = torch::empty_like(a);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < a.numel(); ++i) dst[i] = {body};
    return out;
}}
"""

GELU = "0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))"
GELU_TORCH = "torch.nn.functional.gelu(x, approximate='tanh')"


def cases(backend: str) -> list[tuple[str, str]]:
    """(problem source, candidate source) pairs, each candidate naming its extension as an LLM would."""
    unary = [("relu", "torch.relu(x)", "fmaxf(v, 0.f)"), ("fused_gelu", GELU_TORCH, GELU)]
    unary += [("swish", "x * torch.sigmoid(x)", "v / (1.f + expf(-v))")]
    binary = [("elementwise_add", "a + b", "a[i] + b[i]", "pa[i] + pb[i]")]
    result = []
    for function, expression, body in unary:
        problem = UNARY_PROBLEM.format(expression=expression)
        if backend == "cuda":
            kernel = UNARY_CUDA.format(function=function, body=body)
            declaration = f"torch::Tensor {function}(torch::Tensor x);"
            source = CUDA_CANDIDATE.format(kernel=kernel, declaration=declaration, name=function, function=function)
        else:
            kernel = UNARY_CPU.format(function=function, body=body)
            source = CPU_CANDIDATE.format(kernel=kernel, name=function, function=function)
        result.append((problem, source))
    for function, expression, cuda_body, cpu_body in binary:
        problem = BINARY_PROBLEM.format(expression=expression, shape_a="1 << 20", shape_b="1 << 20")
        if backend == "cuda":
            kernel = ELEMENTWISE_CUDA.format(function=function, body=cuda_body)
            declaration = f"torch::Tensor {function}(torch::Tensor a, torch::Tensor b);"
            source = CUDA_CANDIDATE.format(kernel=kernel, declaration=declaration, name=function, function=function)
        else:
            kernel = BINARY_CPU.format(function=function, body=cpu_body)
            source = CPU_CANDIDATE.format(kernel=kernel, name=function, function=function)
        result.append((problem, source))
    problem = BINARY_PROBLEM.format(expression="a @ b", shape_a="512, 256", shape_b="256, 384")
    if backend == "cuda":
        kernel = MATMUL_CUDA.format(function="tiled_matmul")
        declaration = "torch::Tensor tiled_matmul(torch::Tensor A, torch::Tensor B);"
        result.append(
            (
                problem,
                CUDA_CANDIDATE.format(
                    kernel=kernel, declaration=declaration, name="tiled_matmul", function="tiled_matmul"
                ),
            )
        )
    else:
        kernel = BINARY_CPU.format(function="scaled_add", body="pa[i] + 2.f * pb[i]")
        problem = BINARY_PROBLEM.format(expression="a + 2 * b", shape_a="1 << 20", shape_b="1 << 20")
        result.append((problem, CPU_CANDIDATE.format(kernel=kernel, name="scaled_add", function="scaled_add")))
    return result


def compile_once(problem: str, candidate: str, config: RunConfig, mode: str) -> dict:
    os.environ["KFORGE_INLINE_BUILD"] = mode  # read by the orchestrator and passed to the worker
    start = time.perf_counter()
    result = evaluate_in_worker("compile", problem, candidate, config)
    stage_s = time.perf_counter() - start
    start = time.perf_counter()
    again = evaluate_in_worker("compile", problem, candidate, config)
    return {
        "outcome": result["outcome"],
        "compile_s": result.get("compile_s", float("nan")),
        "stage_s": stage_s,
        "again_s": time.perf_counter() - start,
        "again_outcome": again["outcome"],
        "excerpt": (result.get("error_excerpt") or "")[-600:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--candidates", type=int, default=5)
    parser.add_argument("--modes", default="plain,fast,split", help="of plain, fast, split (split: cuda only)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if args.backend == "cuda" or m != "split"]
    scratch = Path(tempfile.mkdtemp(prefix="kforge-inline-"))
    for mode in modes:
        if mode != "plain":
            start = time.perf_counter()
            header = extensions.prepare_header(scratch / mode / "kernels")
            header_s = time.perf_counter() - start
            state = "ok" if header else "FAILED"
            print(f"precompiled torch/extension.h for {mode}: {header_s:.1f} s, once per toolchain ({state})")
    rows: dict[str, list[dict]] = {mode: [] for mode in modes}

    for index, (problem, candidate) in enumerate(cases(args.backend)[: args.candidates]):
        for mode in modes[index % len(modes) :] + modes[: index % len(modes)]:  # each mode first in turn
            config = RunConfig(cache_dir=str(scratch / mode), backend=args.backend, worker_pool=0)
            row = compile_once(problem, candidate, config, mode)
            rows[mode].append(row)
            print(
                f"  candidate {index} {mode:5s} {row['outcome']:14s} compile {row['compile_s']:6.1f} s  "
                f"stage {row['stage_s']:6.1f} s  again {row['again_s']:5.1f} s",
                flush=True,
            )
            if row["outcome"] != "correct":
                print("   ", row["excerpt"].replace("\n", "\n    "))
    header_line = f"{'path':6s} {'n':>2s} {'compile_s median':>17s} {'min':>6s} {'max':>6s}"
    print(f"\n{header_line} {'stage_s median':>15s} {'again_s median':>15s}")
    for mode, results in rows.items():
        done = [r for r in results if r["outcome"] == "correct"]
        if not done:
            print(f"{mode:6s} {0:2d}  (no build succeeded)")
            continue
        compile_s = [r["compile_s"] for r in done]
        stage_s = statistics.median(r["stage_s"] for r in done)
        again_s = statistics.median(r["again_s"] for r in done)
        spread = f"{statistics.median(compile_s):17.1f} {min(compile_s):6.1f} {max(compile_s):6.1f}"
        print(f"{mode:6s} {len(done):2d} {spread} {stage_s:15.1f} {again_s:15.1f}")
    return 0 if all(r["outcome"] == "correct" for results in rows.values() for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
