"""Every outcome of the evaluation worker, each through a real isolated worker process.

The problem is y = 2x on 4096 floats; most candidates compute it with the same g++ kernel
(compiled once into the session's kernel cache) and then go wrong in one specific way.
"""

import os
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tasks.isolate import PROJECT_ROOT, Limits, run_worker
from tasks.judge import evaluate_in_worker

PROBLEM = '''
"""y = 2x on 4096 floats."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(4096)]


def get_init_inputs():
    return []
'''

TWICE_KERNEL = '''
import torch
import torch.nn as nn

from kforge.kernels import load_cpp

lib = load_cpp(r"""
#include <cstdint>
extern "C" void twice(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = 2.f * x[i];
}
""")
'''


@pytest.fixture
def config(config):
    """Many candidates here compute y = 2x in plain torch, the reference's own op, on purpose: they
    test other outcomes. The library-call check has its own tests in tests/integrity/."""
    return config.model_copy(update={"allow_library_calls": True})


def kernel_candidate(after_kernel: str) -> str:
    """A candidate whose forward computes y = 2x with the g++ kernel, then runs `after_kernel`."""
    forward = "y = torch.empty_like(x)\nlib.twice(x, y, x.numel())\n" + textwrap.dedent(after_kernel).strip()
    return TWICE_KERNEL + (
        "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n" + textwrap.indent(forward, " " * 8) + "\n"
    )


def python_candidate(forward_body: str, prelude: str = "") -> str:
    """A candidate in plain Python: `prelude` at module level, then ModelNew.forward running `forward_body`."""
    return (
        "import torch\nimport torch.nn as nn\n"
        + textwrap.dedent(prelude)
        + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        + textwrap.indent(textwrap.dedent(forward_body).strip(), " " * 8)
        + "\n"
    )


def compile_request(candidate_source: str) -> dict:
    """A compile request for run_worker itself: the candidate's module-level code runs there."""
    return {
        "mode": "compile",
        "problem_source": PROBLEM,
        "candidate_source": candidate_source,
        "backend": "cpu",
        "size_preset": None,
        "init_seed": 3,
    }


def outcome_of(result: dict) -> tuple[str, str | None]:
    return result["outcome"], result.get("error_class")


# --- correct and compile errors ---------------------------------------------------------------


def test_correct_g_plus_plus_candidate(config):
    result = evaluate_in_worker("verify", PROBLEM, kernel_candidate("return y"), config)

    assert result["outcome"] == "correct", result
    assert result["trials"] in (config.correctness_trials, config.correctness_trials + 1)  # not predictable
    assert (result["atol"], result["rtol"]) == (1e-4, 1e-4)
    assert result["max_abs_err"] == 0.0  # 2x is exact in float32
    assert result["worker_s"] > 0


def test_cpp_error_is_a_compile_error_with_the_compiler_message(config):
    broken = kernel_candidate("return y").replace("y[i] = 2.f * x[i];", "out[i] = 2.f * x[i];")

    result = evaluate_in_worker("compile", PROBLEM, broken, config)

    assert outcome_of(result) == ("compile_error", "CompileError")
    assert "kernel.cpp:" in result["error_excerpt"]
    assert "was not declared in this scope" in result["error_excerpt"]


def test_python_syntax_error_is_a_compile_error(config):
    result = evaluate_in_worker("compile", PROBLEM, "import torch\ndef forward(x) return x\n", config)

    assert outcome_of(result) == ("compile_error", "SyntaxError")
    assert "SyntaxError: " in result["error_excerpt"]


def test_file_without_model_new_is_a_compile_error(config):
    result = evaluate_in_worker("compile", PROBLEM, PROBLEM, config)  # defines Model, not ModelNew

    assert outcome_of(result) == ("compile_error", "no_ModelNew")


# --- runtime errors ---------------------------------------------------------------------------


def test_exception_in_forward_is_a_runtime_error_with_its_traceback(config):
    candidate = python_candidate('raise ValueError("block size 0 is invalid")')

    result = evaluate_in_worker("verify", PROBLEM, candidate, config)

    assert outcome_of(result) == ("runtime_error", "ValueError in forward")
    assert 'candidate.py", line 7, in forward' in result["error_excerpt"]
    assert "ValueError: block size 0 is invalid" in result["error_excerpt"]


def test_segfaulting_kernel_kills_only_the_worker(config):
    # The kernel is handed a null output pointer and writes through it.
    candidate = kernel_candidate("lib.twice(x, 0, x.numel())\nreturn y")

    result = evaluate_in_worker("verify", PROBLEM, candidate, config)

    assert outcome_of(result) == ("runtime_error", "SIGSEGV")
    assert result["error_excerpt"].startswith("worker killed by SIGSEGV")


def test_memory_blow_up_is_out_of_memory(config):
    # 16 GiB of address space, never touched: without the worker's limit most hosts would
    # overcommit it and the candidate would pass.
    candidate = python_candidate("hoard = [torch.empty(2**28, dtype=torch.uint8) for _ in range(64)]\nreturn x * 2")

    result = evaluate_in_worker("verify", PROBLEM, candidate, config.model_copy(update={"memory_limit_mb": 2048}))

    assert outcome_of(result) == ("runtime_error", "out_of_memory")
    assert "can't allocate memory" in result["error_excerpt"]


def test_resident_memory_over_the_limit_is_out_of_memory(config, tmp_path):
    """The limit GPU workers get (no address-space limit beside a CUDA context): the parent watches
    the resident memory of the worker and its children and kills it past the limit."""
    hoard = python_candidate(
        "return x * 2", prelude="hoard = torch.ones(2**29)  # 2 GiB, touched\nimport time\ntime.sleep(60)"
    )
    request = compile_request(hoard)
    limits = Limits(wall_s=60, cpu_s=60, memory_mb=None, resident_mb=1024)

    result = run_worker(request, limits, Path(config.cache_dir) / "kernels", threads=2)

    assert outcome_of(result) == ("runtime_error", "out_of_memory")
    assert result["error_excerpt"].startswith("killed at ") and "over the limit of 1024 MB" in result["error_excerpt"]
    assert result["worker_s"] < 30  # stopped at the limit, not at the wall-clock limit


def test_os_exit_at_import_is_a_runtime_error_without_result(config):
    result = evaluate_in_worker("verify", PROBLEM, "import os\nos._exit(0)\n", config)

    assert outcome_of(result) == ("runtime_error", "no_result")
    assert result["error_excerpt"].startswith("worker exited with code 0 without a valid result")


def test_sys_exit_in_forward_is_a_runtime_error(config):
    result = evaluate_in_worker("verify", PROBLEM, python_candidate("import sys\nsys.exit(0)"), config)

    assert outcome_of(result) == ("runtime_error", "SystemExit in forward")


# --- hangs ------------------------------------------------------------------------------------


def test_endless_python_loop_times_out(config):
    result = evaluate_in_worker(
        "verify", PROBLEM, python_candidate("while True:\n    pass"), config.model_copy(update={"run_timeout_s": 5})
    )

    assert outcome_of(result) == ("timeout", "wall_time_limit")
    assert 5 <= result["worker_s"] < 15


def test_endless_cpp_loop_times_out(config):
    spinning = kernel_candidate("return y").replace(
        "for (int64_t i = 0; i < n; ++i) y[i] = 2.f * x[i];",
        "volatile int64_t spins = 0;\n    while (true) spins = spins + 1;",
    )
    # The compile stage builds the kernel into the cache, so the short verify limit is all loop.
    assert outcome_of(evaluate_in_worker("compile", PROBLEM, spinning, config)) == ("correct", None)

    result = evaluate_in_worker("verify", PROBLEM, spinning, config.model_copy(update={"run_timeout_s": 5}))

    assert outcome_of(result) == ("timeout", "wall_time_limit")
    assert 5 <= result["worker_s"] < 15


def test_cpu_time_limit_is_a_timeout(config, tmp_path):
    request = compile_request(python_candidate("return x", prelude="while True:\n    pass"))

    result = run_worker(request, Limits(wall_s=60, cpu_s=4), Path(config.cache_dir) / "kernels", threads=2)

    assert outcome_of(result) == ("timeout", "cpu_time_limit")
    assert result["error_excerpt"].startswith("exceeded the CPU-time limit of 4 s")
    assert result["worker_s"] < 30


# --- wrong outputs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after_kernel", "outcome", "error_class", "report_parts"),
    [
        pytest.param(
            "return y.view(64, 64)",
            "shape_mismatch",
            "shape",
            ["output 0: expected shape (4096,), got (64, 64)"],
            id="shape",
        ),
        pytest.param(
            "return y.double()",
            "shape_mismatch",
            "dtype",
            ["output 0: expected dtype torch.float32, got torch.float64"],
            id="dtype",
        ),
        pytest.param(
            "y[100] += 1e-2\nreturn y",
            "numerical_mismatch",
            "values",
            ["1 of 4096 elements", "max abs err 0.01,", "first mismatching indices [[100]]"],
            id="off-by-1e-2",
        ),
        pytest.param(
            'y[7] = float("nan")\nreturn y',
            "numerical_mismatch",
            "nonfinite",
            ["1 of 4096 elements", "non-finite 1;", "first mismatching indices [[7]]"],
            id="nan",
        ),
        pytest.param(
            # The output is right; the kernel computed it in place over the input.
            "lib.twice(x, x, x.numel())\nreturn x.clone()",
            "integrity_violation",
            "modified_input",
            ["the candidate wrote into input 0"],
            id="writes-into-input",
        ),
    ],
)
def test_wrong_output_is_classified(config, after_kernel, outcome, error_class, report_parts):
    result = evaluate_in_worker("verify", PROBLEM, kernel_candidate(after_kernel), config)

    assert outcome_of(result) == (outcome, error_class)
    for part in report_parts:
        assert part in result["error_excerpt"]


# A tensor subclass returned at once that computes only when the harness converts it
# (INTEGRITY.md row 4): its `.detach().cpu()` yields a plain, correct tensor.
DEFERRED = python_candidate(
    prelude="""
    class Deferred(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            args = [a.pending_input * 2 if isinstance(a, Deferred) else a for a in args]
            return func(*args, **(kwargs or {}))
    """,
    forward_body="""
    result = torch.Tensor._make_subclass(Deferred, torch.empty_like(x))
    result.pending_input = x
    return result
    """,
)


@pytest.mark.parametrize("mode", ["verify", "time"])
def test_deferred_tensor_subclass_is_an_integrity_violation(config, mode):
    result = evaluate_in_worker(mode, PROBLEM, DEFERRED, config)

    assert outcome_of(result) == ("integrity_violation", "not_a_tensor")
    assert result["error_excerpt"] == "output 0 is Deferred, not torch.Tensor"


# --- isolation --------------------------------------------------------------------------------


def test_worker_has_no_api_keys_and_a_temporary_cwd(config, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-for-candidates")
    monkeypatch.chdir(tmp_path)
    candidate = python_candidate(
        prelude="""
        import os

        if "OPENAI_API_KEY" in os.environ:
            raise RuntimeError("the worker can read OPENAI_API_KEY")
        with open("left_by_candidate.txt", "w") as marker:
            marker.write(os.getcwd())
        """,
        forward_body="return x * 2",
    )
    assert os.environ["OPENAI_API_KEY"]

    result = evaluate_in_worker("verify", PROBLEM, candidate, config)

    assert result["outcome"] == "correct", result
    assert not (tmp_path / "left_by_candidate.txt").exists()
    assert not (PROJECT_ROOT / "left_by_candidate.txt").exists()


# --- KernelBench's load_inline ----------------------------------------------------------------

LOAD_INLINE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = r"""
torch::Tensor twice(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const float* src = x.data_ptr<float>();
    float* dst = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) dst[i] = 2.f * src[i];
    return y;
}
"""

extension = load_inline(name="NAME", cpp_sources=CPP, functions=["twice"])


class ModelNew(nn.Module):
    def forward(self, x):
        return extension.twice(x.contiguous())
'''


@pytest.mark.slow
def test_load_inline_candidate_is_correct(config):
    candidate = LOAD_INLINE.replace("NAME", "kforge_test_twice")

    result = evaluate_in_worker("verify", PROBLEM, candidate, config)

    assert result["outcome"] == "correct", result


@pytest.mark.slow
def test_load_inline_build_error_is_a_compile_error(config):
    candidate = LOAD_INLINE.replace("NAME", "kforge_test_broken").replace("return y;", "return y")

    result = evaluate_in_worker("compile", PROBLEM, candidate, config)

    assert outcome_of(result) == ("compile_error", "load_inline")
    assert "Error building extension 'kforge_test_broken'" in result["error_excerpt"]
    assert "error: expected ';'" in result["error_excerpt"].replace("\u2018", "'").replace("\u2019", "'")


@pytest.mark.slow
def test_same_extension_name_different_code_judged_at_once_each_get_their_own_verdict(config):
    """Two candidates that both call load_inline(name="fast_op"), one right and one doubling only the
    positive elements twice over, judged at the same time with one kernel cache."""
    honest = LOAD_INLINE.replace("NAME", "fast_op")
    wrong = honest.replace("dst[i] = 2.f * src[i];", "dst[i] = src[i] > 0 ? 4.f * src[i] : 2.f * src[i];")
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda source: evaluate_in_worker("verify", PROBLEM, source, config), [honest, wrong]))

    assert outcome_of(results[0]) == ("correct", None), results[0]
    assert results[1]["outcome"] == "numerical_mismatch", results[1]
    builds = sorted(p.name for p in (Path(config.cache_dir) / "kernels" / "torch_extensions").glob("fast_op-*"))
    assert len(builds) == 2, builds


@pytest.mark.slow
def test_load_inline_that_includes_torch_extension_again_builds_with_the_precompiled_header(config):
    """load_inline's main.cpp includes torch/extension.h first; a candidate's cpp_sources that include
    it again (most do) must find the header itself where the precompiled one lies, not fail."""
    candidate = LOAD_INLINE.replace("NAME", "kforge_test_twice_again").replace(
        'CPP = r"""\n', 'CPP = r"""\n#include <torch/extension.h>\n'
    )

    result = evaluate_in_worker("verify", PROBLEM, candidate, config)

    assert outcome_of(result) == ("correct", None), result
    builds = list((Path(config.cache_dir) / "kernels" / "torch_extensions").glob("kforge_test_twice_again-*"))
    assert len(builds) == 1, builds
    assert "headers-" in (builds[0] / "build.ninja").read_text()  # built with the precompiled header


# Writes only the positive elements and relies on torch.empty handing out zeroed memory (fresh
# pages from the OS often are): right by luck, wrong by construction.
SKIPS_ZEROS = python_candidate(
    "y = torch.empty_like(x)\nlib.relu_positive_only(x, y, x.numel())\nreturn y",
    prelude="""
from kforge.kernels import load_cpp

lib = load_cpp(r\"\"\"
#include <cstdint>
extern "C" void relu_positive_only(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) if (x[i] > 0.f) y[i] = x[i];
}
\"\"\")
""",
)

RELU_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(1 << 20)]


def get_init_inputs():
    return []
"""


def test_unwritten_output_elements_are_poisoned(config):
    result = evaluate_in_worker("verify", RELU_PROBLEM, SKIPS_ZEROS, config)
    assert outcome_of(result) == ("numerical_mismatch", "nonfinite"), result
    assert "non-finite" in result["error_excerpt"]
