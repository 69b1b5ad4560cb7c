"""Which torch operators a forward dispatched (INTEGRITY.md row 1), recorded at runtime.

The static pre-check sees `torch.matmul` in the source; this sees what actually ran, however it was
reached (getattr, a helper, a library layer, an `except` fallback, at::mm from C++ in a
load_inline extension). Kernels called through ctypes or launched by Triton never pass through
torch's dispatcher and are not seen: they are the candidate's own code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

# Allocation, views, copies and shape queries: a kernel needs them, they compute nothing.
ALWAYS_ALLOWED = frozenset(
    """empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like
    new_ones full full_like new_full fill_ zero_ copy_ clone contiguous _to_copy to view _unsafe_view reshape
    _reshape_alias as_strided expand expand_as permute transpose t unsqueeze squeeze select slice narrow detach
    alias lift_fresh lift_fresh_copy resize_ unbind split split_with_sizes chunk flatten unflatten view_as
    set_ arange scalar_tensor _local_scalar_dense is_same_size sym_size sym_stride sym_numel sym_storage_offset
    stride size numel dim is_contiguous""".split()
)
# Asking for one of these when the reference computes another is still calling the library for it.
MATMUL_FAMILY = frozenset("mm addmm bmm baddbmm matmul linear addmv mv dot vdot _addmm_activation einsum".split())


class RecordOps(TorchDispatchMode):
    """Collects the names of the aten operators dispatched while active (e.g. 'mm', 'relu')."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise torch wraps __torch_dispatch__ so that its first call imports torch._dynamo:
        # 2.6 s of every verify worker on 2 cores, for a mode that never runs under torch.compile.
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def record_ops(fn: Callable[..., Any], *args: Any) -> tuple[Any, set[str]]:
    """fn(*args) and the set of operator names it dispatched."""
    with RecordOps() as recorder:
        result = fn(*args)
    return result, recorder.ops


def library_calls(reference_ops: set[str], candidate_ops: set[str]) -> list[str]:
    """The compute operators the candidate dispatched that the reference computes (sorted)."""
    computed = reference_ops - ALWAYS_ALLOWED
    if computed & MATMUL_FAMILY:
        computed |= MATMUL_FAMILY
    return sorted(candidate_ops & computed)
