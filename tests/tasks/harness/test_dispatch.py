"""Which recorded device kernels count as library calls (tasks/harness/dispatch.py); the GPU test that
records them from a real cuBLAS call is tests/integrity/test_gpu_cheats.py."""

import pytest

from tasks.harness.dispatch import KERNEL_PREFIX, library_kernels

OWN_SOURCE = """
__global__ void tiled_gemm_kernel(const float* a, const float* b, float* c, int n) { }
"""


@pytest.mark.parametrize(
    ("kernel", "source", "is_library"),
    [
        ("ampere_sgemm_128x64_nn", "", True),  # cuBLAS, Ampere
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "", True),  # cuBLAS, Hopper
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "", True),  # cuBLASLt, Hopper
        ("void cudnn::cnn::implicit_convolve_sgemm<float, float, 128>(int, int)", "", True),  # cuDNN
        ("void tiled_gemm_kernel(float const*, float const*, float*, int)", OWN_SOURCE, False),  # its own
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128>(Params)", "#include <cutlass/gemm.h>", False),
        ("void at::native::vectorized_elementwise_kernel<4, float>(int)", "", False),  # torch, no GEMM
    ],
)
def test_library_kernels_of_a_matmul_reference(kernel, source, is_library):
    found = library_kernels({"mm", "empty"}, {"relu", KERNEL_PREFIX + kernel}, source)
    assert found == ([kernel] if is_library else [])


def test_a_reference_without_a_matrix_product_or_convolution_allows_any_kernel():
    assert library_kernels({"relu", "empty_like"}, {KERNEL_PREFIX + "ampere_sgemm_128x64_nn"}, "") == []
    assert library_kernels({"conv2d"}, {KERNEL_PREFIX + "ampere_sgemm_128x64_nn"}, "") == ["ampere_sgemm_128x64_nn"]
