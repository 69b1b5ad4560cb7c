"""Which torch operators a forward dispatched (INTEGRITY.md rows 1 and 18), recorded at runtime.

The static pre-check sees `torch.matmul` in the source; this sees what actually ran, however it was
reached (getattr, a helper, a library layer, an `except` fallback, at::mm from C++ in a
load_inline extension), on every thread of the process: torch's profiler with
`profile_all_threads`, so an op called from a helper thread or a thread C++ started is seen too
(a TorchDispatchMode sees only its own thread). Where that option is missing (older torch), the
recording falls back to the calling thread and says so. Kernels called through ctypes or launched
by Triton never pass through torch's dispatcher and are not seen: they are the candidate's own code.
It runs in the candidate's process, so it is a first line: the orchestrator's judging stands behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def record_ops(fn: Callable[..., Any], *args: Any, all_threads: bool = True) -> tuple[Any, set[str]]:
    """fn(*args) and the set of aten operator names (e.g. 'mm', 'relu') dispatched while it ran,
    on every thread of the process (`all_threads`) or on the calling thread alone. One profiler per
    process at a time: the orchestrator records references under a lock (tasks/trusted.py)."""
    from torch.autograd.profiler import profile

    # torch.profiler.profile would look for torch._inductor, which imports dynamo (1 s) and replaces
    # torch.manual_seed: the autograd profiler underneath it does the recording without that.
    config = _all_threads_config() if all_threads else None
    with profile(use_kineto=True, experimental_config=config) as recorded:
        result = fn(*args)
    names = {event.name for event in recorded.function_events}
    return result, {name[6:].split(".")[0] for name in names if name.startswith("aten::")}


def _all_threads_config() -> Any:
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):  # an older torch: the calling thread only
        print("kforge: warning: this torch records ops on the calling thread only", flush=True)
        return None


def library_calls(reference_ops: set[str], candidate_ops: set[str]) -> list[str]:
    """The compute operators the candidate dispatched that the reference computes (sorted)."""
    computed = reference_ops - ALWAYS_ALLOWED
    if computed & MATMUL_FAMILY:
        computed |= MATMUL_FAMILY
    return sorted(candidate_ops & computed)
