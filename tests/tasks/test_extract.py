"""extract_candidate on replies shaped like real model output."""

import ast
import textwrap

import pytest

from tasks.extract import extract_candidate

RELU = textwrap.dedent(
    '''
    import torch
    from torch.utils.cpp_extension import load_inline

    cuda_source = """
    __global__ void relu_kernel(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    """

    relu = load_inline(name="relu", cpp_sources="", cuda_sources=cuda_source, functions=["relu"])


    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return relu.relu(x)
    '''
).lstrip()

RELU_FIXED = RELU.replace("y[i] = x[i] > 0.f", "y[i] = x[i] >= 0.f")


def reply(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def test_prose_and_one_block():
    text = f"I'll write a fused CUDA ReLU.\n\n```python\n{RELU}```\n\nThis launches one thread per element."
    assert extract_candidate(text, "stop") == (RELU, None)


def test_of_two_blocks_the_last_that_defines_model_new_is_taken():
    text = (
        f"First attempt:\n\n```python\n{RELU}```\n\nWait, ReLU(0) should take the other branch. Corrected:\n\n"
        f"```python\n{RELU_FIXED}```\n\nUsage:\n\n```python\nmodel = ModelNew().cuda()\n```\n"
    )
    assert extract_candidate(text) == (RELU_FIXED, None)


def test_a_cpp_block_is_not_the_candidate_but_the_python_block_is():
    text = (
        f"The Python module:\n\n```python\n{RELU}```\n\nFor reference, the same as a C++ module:\n\n"
        "```cpp\nclass ModelNew : public torch::nn::Module {\n  torch::Tensor forward(torch::Tensor x);\n};\n```\n"
    )
    assert extract_candidate(text) == (RELU, None)


def test_only_a_cuda_block_is_no_candidate():
    text = "```cuda\n__global__ void k(float* x) {}\nclass ModelNew {};\n```\n"
    assert extract_candidate(text) == (None, "no code block defines class ModelNew")


def test_a_mislabelled_block_that_is_python_is_accepted():
    assert extract_candidate(f"```cpp\n{RELU}```\n") == (RELU, None)


def test_a_reply_without_code():
    text = "A ReLU is memory bound, so the best kernel is one that reads and writes each element once."
    assert extract_candidate(text) == (None, "the reply has no code block")


@pytest.mark.parametrize("text", ["", "   \n\n", "\ufeff\r\n"])
def test_an_empty_reply(text):
    assert extract_candidate(text) == (None, "empty reply")


def test_a_block_without_model_new():
    text = "Here is a helper:\n\n```python\nimport torch\n\ndef relu(x):\n    return x.clamp_min(0)\n```\n"
    assert extract_candidate(text) == (None, "no code block defines class ModelNew")


def test_a_reply_cut_off_mid_class_is_refused_with_the_reason():
    cut = RELU[: RELU.index("relu.relu(x)")] + "relu.relu(x,"
    source, reason = extract_candidate(f"Here is the kernel:\n\n```python\n{cut}", "length")
    assert source is None
    assert "cut off" in reason and "finish_reason=length" in reason


def test_a_reply_cut_off_before_model_new_says_so():
    cut = RELU[: RELU.index("class ModelNew")]
    source, reason = extract_candidate(f"```python\n{cut}", "length")
    assert source is None
    assert "finish_reason=length" in reason and "ModelNew" in reason


def test_an_unclosed_block_that_parses_is_accepted():
    assert extract_candidate(f"Here you go:\n```python\n{RELU}", "stop") == (RELU, None)


def test_a_complete_block_with_a_syntax_error_is_still_returned():
    broken = RELU.replace("def forward(self, x):", "def forward(self, x)")
    source, reason = extract_candidate(f"```python\n{broken}```\n", "stop")
    assert (source, reason) == (broken, None)
    with pytest.raises(SyntaxError):
        ast.parse(source)


def test_a_code_only_reply():
    assert extract_candidate(RELU) == (RELU, None)


def test_a_code_only_reply_cut_off():
    source, reason = extract_candidate(RELU[:-8], "length")
    assert source is None and "finish_reason=length" in reason


def test_tilde_fences_and_a_longer_fence_around_inner_backticks():
    docstring = '    """Use as:\n\n    ```\n    y = ModelNew()(x)\n    ```\n    """\n'
    documented = RELU.replace("(torch.nn.Module):\n", "(torch.nn.Module):\n" + docstring)
    assert extract_candidate(f"~~~python\n{RELU}~~~\n") == (RELU, None)
    assert extract_candidate(f"~~~\n{documented}~~~\n") == (documented, None)
    assert extract_candidate(f"````python\n{documented}````\n") == (documented, None)


@pytest.mark.parametrize("tag", ["python", "py", "Python", "python3", "", "python title=model_new.py"])
def test_language_tags(tag):
    assert extract_candidate(f"Kernel:\n```{tag}\n{RELU}```") == (RELU, None)


def test_an_indented_fence_inside_a_list():
    indented = textwrap.indent(RELU, "   ")
    text = f"1. Write the kernel:\n\n   ```python\n{indented}   ```\n2. Benchmark it.\n"
    assert extract_candidate(text) == (RELU, None)


def test_bom_and_crlf_are_normalised():
    text = "\ufeffHere it is:\r\n```python\r\n" + RELU.replace("\n", "\r\n") + "```\r\n"
    source, reason = extract_candidate(text)
    assert (source, reason) == (RELU, None)


def test_inline_triple_backticks_are_not_a_fence():
    text = f"Call it as ```ModelNew()(x)``` after building.\n\n```python\n{RELU}```"
    assert extract_candidate(text) == (RELU, None)
