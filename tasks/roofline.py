"""Roofline bounds: a time no hardware could reach (INTEGRITY.md row 19).

A measured runtime is compared against what the device can physically do: the device's peak memory
bandwidth and peak FLOP/s, from a table of NVIDIA datacenter GPUs or, for the CPU and GPUs the table
lacks, measured in this process and scaled up by a safety factor.

- A time shorter than writing the outputs at peak bandwidth is **impossible** (`integrity_violation`).
  Output bytes that fit in the caches may end the timed window there, dirty, so they are charged at a
  (generous) cache bandwidth rather than DRAM/HBM bandwidth.
- A time shorter than the roofline of the problem (its inputs and outputs moved once at peak
  bandwidth, or the reference's counted FLOPs at peak) is **suspect**: legitimate algebraic
  simplification can get there, so it is flagged for review and the soft check, never refused.
- Every assessed attempt gets its achieved fraction of the roofline (1.0 at the roofline).

Every number here errs on the side of the kernel: a peak too high only lets a cheat through, a peak
too low refuses an honest kernel, so table entries are the vendors' dense peak figures (the highest
the hardware is specified for), measured peaks are multiplied by `MEASURED_SAFETY_FACTOR`, and the
compute bound uses the device's largest tensor-core peak whatever the dtype.

This module runs in the trusted orchestrator process, never in a candidate's worker. It imports torch
lazily, inside the functions that need it. The bounds assume the caches were flushed before each
timed run, as the harness's timing does (`flush_bytes` says how large the buffer must be).
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

# A measured "peak" is what one copy or one matmul reached in this process, on a machine that may be
# busy with other work: it underestimates the true peak. Bounds built on it are multiplied by this,
# because a bound must never refuse an honest kernel.
MEASURED_SAFETY_FACTOR = 2.0
# Output bytes that fit in a cache may still sit there, dirty, when the timed window closes: a GPU's
# L2 (and a measured device's innermost cache) is charged at this multiple of the DRAM/HBM peak.
# Vendors publish no L2 bandwidth; microbenchmarks put it at about 2-4x HBM on A100/H100 and about
# 5-10x GDDR on Ada parts, so 16x is above all of them.
CACHE_BANDWIDTH_FACTOR = 16.0
# A cache-flush buffer is at least this large, and at least twice the last-level cache.
MIN_FLUSH_BYTES = 64 * 1024 * 1024
# When the CPU's last-level cache size cannot be read, assume one this large (generous both for
# the write floor and for the flush buffer).
FALLBACK_LLC_BYTES = 256 * 1024 * 1024

Verdict = Literal["impossible", "suspect", "ok"]

_TB = 1e12  # bytes/s per TB/s, FLOP/s per TFLOP/s
_MIB = 1024 * 1024


@dataclass(frozen=True)
class DevicePeak:
    """What one device can do at most.

    name: the device's name (torch.cuda.get_device_name() for GPUs, "cpu" for the host).
    memory_bandwidth: peak DRAM/HBM bandwidth, bytes/s.
    fp32_flops: peak float32 FLOP/s without tensor cores.
    tf32_tensor_flops, bf16_tensor_flops, fp16_tensor_flops: dense tensor-core peaks, FLOP/s (on the
        CPU: measured matmul rates in those dtypes; TF32 is float32 there).
    llc_bytes: L2 (GPU) or last-level (CPU) cache size, bytes (all instances together).
    source: "table" (vendor spec sheet) or "measured" (this process, times the safety factor).
    cache_bandwidth: an upper estimate of the rate writes can enter the last-level cache, bytes/s;
        0 (the default) stands for CACHE_BANDWIDTH_FACTOR times memory_bandwidth.
    inner_cache_bytes, inner_cache_bandwidth: the write-back caches inside the last level (a CPU's L1d
        and L2, all cores together) and an upper estimate of the rate writes can enter them; 0 for GPUs,
        whose L1 is write-through. inner_cache_bandwidth 0 stands for CACHE_BANDWIDTH_FACTOR times
        memory_bandwidth.
    """

    name: str
    memory_bandwidth: float
    fp32_flops: float
    tf32_tensor_flops: float
    bf16_tensor_flops: float
    fp16_tensor_flops: float
    llc_bytes: int
    source: Literal["table", "measured"]
    cache_bandwidth: float = 0.0
    inner_cache_bytes: int = 0
    inner_cache_bandwidth: float = 0.0

    def __post_init__(self) -> None:
        generous = CACHE_BANDWIDTH_FACTOR * self.memory_bandwidth
        if self.cache_bandwidth <= 0:
            object.__setattr__(self, "cache_bandwidth", generous)
        if self.inner_cache_bytes and self.inner_cache_bandwidth <= 0:
            object.__setattr__(self, "inner_cache_bandwidth", generous)

    @property
    def best_compute_flops(self) -> float:
        """The largest FLOP/s peak this device has, in any dtype (the generous compute ceiling)."""
        return max(self.fp32_flops, self.tf32_tensor_flops, self.bf16_tensor_flops, self.fp16_tensor_flops)

    @property
    def cache_bytes(self) -> int:
        """All the write-back cache an output can sit in when the timed window closes, bytes."""
        return self.inner_cache_bytes + self.llc_bytes

    def write_levels(self) -> tuple[tuple[int, float], ...]:
        """(capacity bytes, write bandwidth bytes/s) of each level writes can land in, innermost first,
        ending with DRAM/HBM (unbounded capacity)."""
        levels: list[tuple[int, float]] = []
        if self.inner_cache_bytes:
            levels.append((self.inner_cache_bytes, self.inner_cache_bandwidth))
        levels.append((self.llc_bytes, self.cache_bandwidth))
        levels.append((2**62, self.memory_bandwidth))
        return tuple(levels)


def _gpu(name: str, tb_s: float, fp32: float, tf32: float, bf16: float, fp16: float, l2_mib: int) -> DevicePeak:
    """A table entry: bandwidth in TB/s, peaks in dense TFLOP/s, L2 in MiB (as PyTorch reports it)."""
    return DevicePeak(
        name=name,
        memory_bandwidth=tb_s * _TB,
        fp32_flops=fp32 * _TB,
        tf32_tensor_flops=tf32 * _TB,
        bf16_tensor_flops=bf16 * _TB,
        fp16_tensor_flops=fp16 * _TB,
        llc_bytes=l2_mib * _MIB,
        source="table",
    )


# Vendor spec-sheet peaks. The datasheets print tensor-core rates "with sparsity"; the dense rates
# below are half of those. Each entry: the aliases it is found by (torch.cuda.get_device_name()
# spellings first, then shorter ones), then the numbers. A bare family name ("H100", "A100") is an
# alias of every member: a name that matches only that gets the field-wise maximum of the family.
_TABLE: tuple[tuple[tuple[str, ...], DevicePeak], ...] = (
    # NVIDIA H200 datasheet (SXM): 4.8 TB/s HBM3e; FP32 67 TF; TF32 989 / BF16, FP16 1,979 TF with
    # sparsity. L2: 60 MB, as PyTorch reports it on an H200 (the full GH100 L2).
    (("NVIDIA H200", "H200 SXM", "H200"), _gpu("NVIDIA H200", 4.8, 67.0, 494.5, 989.5, 989.5, 60)),
    # NVIDIA H200 datasheet (NVL): 4.8 TB/s; FP32 60 TF; TF32 835 / BF16, FP16 1,671 TF with sparsity.
    (("NVIDIA H200 NVL", "H200 NVL", "H200"), _gpu("NVIDIA H200 NVL", 4.8, 60.0, 417.5, 835.5, 835.5, 60)),
    # NVIDIA H100 datasheet (SXM): 3.35 TB/s HBM3; FP32 67 TF; TF32 989 / BF16, FP16 1,979 TF with
    # sparsity. L2 50 MB (NVIDIA H100 architecture whitepaper).
    (
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3", "H100 SXM", "H100"),
        _gpu("NVIDIA H100 80GB HBM3", 3.35, 67.0, 494.5, 989.5, 989.5, 50),
    ),
    # NVIDIA H100 datasheet (PCIe): 2 TB/s HBM2e; FP32 51 TF; TF32 756 / BF16, FP16 1,513 TF with sparsity.
    (("NVIDIA H100 PCIe", "H100 PCIe", "H100"), _gpu("NVIDIA H100 PCIe", 2.0, 51.0, 378.0, 756.5, 756.5, 50)),
    # NVIDIA H100 datasheet (NVL): 3.9 TB/s; FP32 60 TF; TF32 835 / BF16, FP16 1,671 TF with sparsity.
    (("NVIDIA H100 NVL", "H100 NVL", "H100"), _gpu("NVIDIA H100 NVL", 3.9, 60.0, 417.5, 835.5, 835.5, 50)),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: up to 4.9 TB/s (HBM3e part); compute as H100 SXM.
    (("NVIDIA GH200", "GH200"), _gpu("NVIDIA GH200", 4.9, 67.0, 494.5, 989.5, 989.5, 60)),
    # NVIDIA A100 datasheet: FP32 19.5 TF; TF32 156, BF16/FP16 312 TF dense (312/624 with sparsity);
    # 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s, 40GB 1,555 GB/s. L2 40 MB (NVIDIA A100 whitepaper).
    (
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", "A100"),
        _gpu("NVIDIA A100-SXM4-80GB", 2.039, 19.5, 156, 312, 312, 40),
    ),
    (
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", "A100"),
        _gpu("NVIDIA A100 80GB PCIe", 1.935, 19.5, 156, 312, 312, 40),
    ),
    (
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", "A100"),
        _gpu("NVIDIA A100-SXM4-40GB", 1.555, 19.5, 156, 312, 312, 40),
    ),
    (
        ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB", "A100"),
        _gpu("NVIDIA A100-PCIE-40GB", 1.555, 19.5, 156, 312, 312, 40),
    ),
    # NVIDIA L40S datasheet: 864 GB/s GDDR6; FP32 91.6 TF; TF32 366 / BF16, FP16 733 TF with sparsity.
    # L2 96 MB (NVIDIA Ada architecture whitepaper, full AD102).
    (("NVIDIA L40S", "L40S"), _gpu("NVIDIA L40S", 0.864, 91.6, 183.0, 366.5, 366.5, 96)),
    # NVIDIA L4 datasheet: 300 GB/s GDDR6; FP32 30.3 TF; TF32 120 / BF16, FP16 242 TF with sparsity.
    # L2 48 MB (NVIDIA Ada architecture whitepaper, AD104).
    (("NVIDIA L4", "L4"), _gpu("NVIDIA L4", 0.300, 30.3, 60.0, 121.0, 121.0, 48)),
    # NVIDIA A10 datasheet: 600 GB/s GDDR6; FP32 31.2 TF; TF32 62.5, BF16/FP16 125 TF dense. L2 6 MB (GA102).
    (("NVIDIA A10", "A10"), _gpu("NVIDIA A10", 0.600, 31.2, 62.5, 125.0, 125.0, 6)),
    # A10G (AWS G5): NVIDIA publishes no datasheet; AWS gives 600 GB/s. The A10's peaks scaled up to
    # the A10G's 80 SMs at 1.71 GHz boost (against 72 at 1.695), then rounded up.
    (("NVIDIA A10G", "A10G"), _gpu("NVIDIA A10G", 0.600, 35.0, 70.0, 140.0, 140.0, 6)),
)


def _alias_matches(alias: str, name: str) -> bool:
    """Whether `alias` occurs in `name`, case-insensitively, not inside a longer word ("L4" is not in "L40S")."""
    pattern = r"(?<![a-z0-9])" + re.escape(alias.lower()) + r"(?![a-z0-9])"
    return re.search(pattern, name.lower()) is not None


def _merge(name: str, peaks: list[DevicePeak]) -> DevicePeak:
    """The field-wise maximum of several table entries (the generous choice when a name is ambiguous)."""
    if len(peaks) == 1:
        return peaks[0]
    return DevicePeak(
        name=f"{name} (max of {', '.join(p.name for p in peaks)})",
        memory_bandwidth=max(p.memory_bandwidth for p in peaks),
        fp32_flops=max(p.fp32_flops for p in peaks),
        tf32_tensor_flops=max(p.tf32_tensor_flops for p in peaks),
        bf16_tensor_flops=max(p.bf16_tensor_flops for p in peaks),
        fp16_tensor_flops=max(p.fp16_tensor_flops for p in peaks),
        llc_bytes=max(p.llc_bytes for p in peaks),
        source="table",
        cache_bandwidth=max(p.cache_bandwidth for p in peaks),
    )


def table_peak(device_name: str) -> DevicePeak | None:
    """The table entry for a device name, or None when the table has none.

    In: a name as torch.cuda.get_device_name() returns it ("NVIDIA H100 80GB HBM3"). An exact name wins;
    otherwise the entries whose longest matching alias is longest; a tie (a bare "NVIDIA H100 ...", say)
    gives the field-wise maximum of the tied entries. Out: a DevicePeak with source "table", or None.
    """
    name = device_name.strip()
    best_score, best = 0.0, []
    for aliases, peak in _TABLE:
        if peak.name.lower() == name.lower():
            score = math.inf
        else:
            score = max((len(a) for a in aliases if _alias_matches(a, name)), default=0)
        if score > best_score:
            best_score, best = score, [peak]
        elif score == best_score and score > 0:
            best.append(peak)
    return _merge(name, best) if best else None


def device_peak(device_name: str | None, device: str | None = None) -> DevicePeak:
    """The peaks of a device, from the table or, failing that, measured here.

    In: device_name, as torch.cuda.get_device_name() returns it, "cpu" for the host, or None for the
    device `device` names (default: the current CUDA device if there is one, else the CPU); device,
    optionally, the torch device to measure when the name is not in the table (default: a local CUDA
    device of that name, else the current CUDA device, else the CPU).
    Out: a DevicePeak; source "table" or "measured".
    """
    if device_name is None:
        device = device or _default_device()
        device_name = "cpu" if device.startswith("cpu") else _cuda_name(device)
    if device_name.strip().lower() != "cpu":
        peak = table_peak(device_name)
        if peak is not None:
            return peak
    elif device is None:
        device = "cpu"
    return measured_peak(device or _local_device_named(device_name))


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _cuda_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def _local_device_named(device_name: str) -> str:
    """The local CUDA device called `device_name`, else the current CUDA device, else "cpu"."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    for index in range(torch.cuda.device_count()):
        if torch.cuda.get_device_name(index).strip().lower() == device_name.strip().lower():
            return f"cuda:{index}"
    return "cuda"


def measured_peak(device: str = "cpu") -> DevicePeak:
    """Peaks measured on `device` ("cpu", "cuda", "cuda:1"), made generous by scale_measured; cached per process.

    Memory bandwidth: the best of a few copies of a 256 MB tensor (1 GB, or 4x L2, on a GPU), counting
    bytes read and written. Cache bandwidths: the same, on copies that fit in the cache (on the CPU:
    one in the last level but not in the private caches, one in the private caches). FLOP/s: the best
    of a few matmuls in float32 (without TF32), TF32 (CUDA only; float32 on the CPU), bfloat16 and
    float16. On the CPU torch uses every core this process may run on. Takes a few seconds.
    Out: a DevicePeak with source "measured".
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return _measured_peak(str(dev))


@functools.cache
def _measured_peak(device: str) -> DevicePeak:
    raw = _measure_cuda(device) if device.startswith("cuda") else _measure_cpu()
    return scale_measured(raw)


def scale_measured(raw: DevicePeak) -> DevicePeak:
    """A raw measurement made generous: every rate times MEASURED_SAFETY_FACTOR; the innermost cache
    at least CACHE_BANDWIDTH_FACTOR times memory bandwidth (a copy small enough to stay there is
    short enough for torch's per-call overhead to hide its speed), every cache at least memory
    bandwidth. In and out: DevicePeak (source "measured")."""
    f = MEASURED_SAFETY_FACTOR
    memory = raw.memory_bandwidth * f
    generous = CACHE_BANDWIDTH_FACTOR * memory
    if raw.inner_cache_bytes:
        llc_rate = max(raw.cache_bandwidth * f, memory)
        inner_rate = max(raw.inner_cache_bandwidth * f, generous)
    else:
        llc_rate = max(raw.cache_bandwidth * f, generous)
        inner_rate = 0.0
    return DevicePeak(
        name=raw.name,
        memory_bandwidth=memory,
        fp32_flops=raw.fp32_flops * f,
        tf32_tensor_flops=raw.tf32_tensor_flops * f,
        bf16_tensor_flops=raw.bf16_tensor_flops * f,
        fp16_tensor_flops=raw.fp16_tensor_flops * f,
        llc_bytes=raw.llc_bytes,
        source="measured",
        cache_bandwidth=llc_rate,
        inner_cache_bytes=raw.inner_cache_bytes,
        inner_cache_bandwidth=inner_rate,
    )


def cpu_caches() -> tuple[int, int]:
    """(bytes of the CPUs' caches inside the last level, bytes of the last level), all instances
    together, from sysfs (instruction caches left out). (0, FALLBACK_LLC_BYTES) when none can be read."""
    instances: dict[tuple[int, str, str], int] = {}
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", text)
        if kind == "Instruction" or not match:
            continue
        instances[(level, kind, shared)] = int(match[1]) * {"": 1, "K": 1024, "M": _MIB, "G": 1024 * _MIB}[match[2]]
    if not instances:
        return 0, FALLBACK_LLC_BYTES
    last = max(level for level, _, _ in instances)
    inner = sum(size for (level, _, _), size in instances.items() if level < last)
    llc = sum(size for (level, _, _), size in instances.items() if level == last)
    return inner, llc


def _best_seconds(fn: Callable[[], object], runs: int) -> float:
    """The shortest wall time of `runs` calls of fn, after one warm-up call."""
    fn()
    best = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _copy_rate(n_bytes: int, reps: int, timer: Callable[[Callable[[], object], int], float], **where: Any) -> float:
    """Bytes/s read and written by `reps` back-to-back copies of an n_bytes float32 tensor (best of a few)."""
    import torch

    src = torch.ones(max(1, n_bytes // 4), **where)
    dst = torch.zeros_like(src)

    def copies() -> None:
        for _ in range(reps):
            dst.copy_(src)

    return 2 * src.nbytes * reps / timer(copies, 5)


def _matmul_rate(
    n: int, dtype: torch.dtype, timer: Callable[[Callable[[], object], int], float], **where: Any
) -> float:
    """FLOP/s of an n x n x n matmul in dtype (best of a few)."""
    import torch

    a = torch.randn(n, n, **where).to(dtype)
    b = torch.randn(n, n, **where).to(dtype)
    return 2 * n**3 / timer(functools.partial(torch.mm, a, b), 3)


def _cpu_rates(threads: int, inner: int, llc: int) -> tuple[float, ...]:
    """(memory, last-level, private-cache copy rates, fp32, bf16, fp16 matmul rates) with torch on `threads` threads."""
    import torch

    torch.set_num_threads(threads)
    memory = _copy_rate(256 * _MIB, 1, _best_seconds)
    # In and out together a quarter of the last level (at most 64 MB), past the private caches.
    llc_copy = max(min(llc // 8, 32 * _MIB), 2 * inner)
    llc_rate = _copy_rate(llc_copy, max(1, 128 * _MIB // llc_copy), _best_seconds)
    # 256 KB in, 256 KB out: in the private caches of any core this decade.
    inner_rate = _copy_rate(256 * 1024, 64, _best_seconds)
    flops = (_matmul_rate(1024, d, _best_seconds) for d in (torch.float32, torch.bfloat16, torch.float16))
    return (memory, llc_rate, inner_rate, *flops)


def _measure_cpu() -> DevicePeak:
    """Raw CPU peaks (no safety factor): each rate the larger of torch on every core this process may
    run on and one thread's rate times that many cores. The second is still near the peak when other
    processes keep some cores busy (a multithreaded op waits for its slowest thread), and above it on
    an idle machine (memory bandwidth does not scale with cores): both errors are on the generous side.
    """
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = torch.get_num_threads()
    inner, llc = cpu_caches()
    try:
        with torch.no_grad():
            every_core = _cpu_rates(max(cores, threads), inner, llc)
            one_core = _cpu_rates(1, inner, llc)
    finally:
        torch.set_num_threads(threads)
    memory, llc_rate, inner_rate, fp32, bf16, fp16 = (
        max(many, one * cores) for many, one in zip(every_core, one_core, strict=True)
    )
    return DevicePeak(
        name="cpu",
        memory_bandwidth=memory,
        fp32_flops=fp32,
        tf32_tensor_flops=fp32,
        bf16_tensor_flops=bf16,
        fp16_tensor_flops=fp16,
        llc_bytes=llc,
        source="measured",
        cache_bandwidth=llc_rate,
        inner_cache_bytes=inner,
        inner_cache_bandwidth=inner_rate,
    )


def _measure_cuda(device: str) -> DevicePeak:
    """Raw peaks of one CUDA device (no safety factor), timed with CUDA events."""
    import torch

    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    llc = int(getattr(props, "L2_cache_size", 0)) or 128 * _MIB

    def timer(fn: Callable[[], object], runs: int) -> float:
        fn()
        torch.cuda.synchronize(dev)
        best = math.inf
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return best

    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    rates = {}
    with torch.cuda.device(dev), torch.no_grad():
        try:
            memory = _copy_rate(max(1024 * _MIB, 4 * llc), 1, timer, device=dev)
            cache = _copy_rate(llc // 8, 32, timer, device=dev)  # in and out together: a quarter of L2
            for label, dtype, tf32 in (
                ("fp32", torch.float32, False),
                ("tf32", torch.float32, True),
                ("bf16", torch.bfloat16, True),
                ("fp16", torch.float16, True),
            ):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                rates[label] = _matmul_rate(8192, dtype, timer, device=dev)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    return DevicePeak(
        name=torch.cuda.get_device_name(dev),
        memory_bandwidth=memory,
        fp32_flops=rates["fp32"],
        tf32_tensor_flops=rates["tf32"],
        bf16_tensor_flops=rates["bf16"],
        fp16_tensor_flops=rates["fp16"],
        llc_bytes=llc,
        source="measured",
        cache_bandwidth=cache,
    )


def flush_bytes(peak: DevicePeak) -> int:
    """How large a cache-flush buffer must be on this device: at least twice its caches (L2/LLC and,
    on a CPU, the private caches inside it) and at least MIN_FLUSH_BYTES, rounded up to a whole MiB.
    In: a DevicePeak. Out: bytes."""
    need = max(2 * peak.cache_bytes, MIN_FLUSH_BYTES)
    return -(-need // _MIB) * _MIB


def _tensor_leaves(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in obj: obj itself, or inside (nested) lists, tuples and dict values."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensor_leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensor_leaves(item)


def _distinct_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes the tensors occupy, each byte counted once.

    Views of one storage are counted by the union of their extents, but never more than the sum of
    their elements (a strided view does not own its gaps); an expanded (stride 0) dimension adds no
    bytes; the same tensor twice counts once. Tensors without a plain storage (sparse, nested) count 0:
    a lower count only lowers the bounds.
    """
    groups: dict[tuple[str, int], tuple[list[tuple[int, int]], int]] = {}
    for t in tensors:
        if t.numel() == 0:
            continue
        try:
            storage_ptr = t.untyped_storage().data_ptr()
            offset = t.storage_offset()
            strides = t.stride()
        except (RuntimeError, NotImplementedError):
            continue
        item = t.element_size()
        start = offset * item
        extent = (1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, strides))) * item
        own = math.prod(size for size, stride in zip(t.shape, strides) if stride != 0) * item
        key = (str(t.device), storage_ptr if storage_ptr else id(t))
        spans, total = groups.get(key, ([], 0))
        spans.append((start, start + extent))
        groups[key] = (spans, total + own)
    result = 0
    for spans, own_total in groups.values():
        union, reach = 0, -1
        for lo, hi in sorted(spans):
            if hi > reach:
                union += hi - max(lo, reach)
                reach = hi
        result += min(union, own_total)
    return result


def problem_bytes(inputs: Any, outputs: Any) -> tuple[int, int]:
    """(bytes of all input tensors, bytes of all output tensors).

    In: inputs, a list/tuple as get_inputs() returns it (tensors anywhere in nested lists, tuples and
    dict values count; anything else counts 0); outputs, a tensor or a (nested) tuple/list of tensors.
    Each side counts every byte once (see _distinct_bytes). Out: two ints.
    """
    return _distinct_bytes(_tensor_leaves(inputs)), _distinct_bytes(_tensor_leaves(outputs))


def reference_flops(model: Callable[..., Any], inputs: Any) -> int | None:
    """FLOPs of one forward of the reference `model` on `inputs`, as torch's FlopCounterMode counts them.

    In: the reference nn.Module (or any callable) and the list of its positional inputs; runs
    model(*inputs) once under torch.no_grad (an in-place model changes its inputs: pass copies if that
    matters). FlopCounterMode counts only the ops it has formulas for (matmuls, convolutions,
    attention); elementwise ops, reductions and norms count 0, so the count is a lower bound of the
    work and 0 means "nothing counted", not "no work". Out: an int, or None when the forward or the
    counting fails.
    """
    try:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            model(*inputs)
        return int(counter.get_total_flops())
    except Exception:
        return None


@dataclass(frozen=True)
class Bounds:
    """The floors one problem's runtime is checked against, with what they were built from.

    input_bytes, output_bytes, flops: the problem (flops None when not counted).
    device, source: the DevicePeak's name and source.
    write_floor_ms: no kernel can leave its outputs written faster (see `bounds`); below it: impossible.
    memory_ms: the inputs read once plus the outputs written once, at peak memory bandwidth (never
        below write_floor_ms).
    compute_ms: the counted FLOPs at the device's best compute peak (0 when flops is None or 0).
    roofline_ms: max(memory_ms, compute_ms); below it: suspect.
    """

    input_bytes: int
    output_bytes: int
    flops: int | None
    device: str
    source: str
    write_floor_ms: float
    memory_ms: float
    compute_ms: float
    roofline_ms: float


def bounds(peak: DevicePeak, input_bytes: int, output_bytes: int, flops: int | None) -> Bounds:
    """The write floor and roofline of one problem on one device.

    In: the device's peaks, the problem's input and output bytes (problem_bytes), its reference FLOPs
    (reference_flops; None when unknown). Out: Bounds, times in milliseconds.

    write_floor: every output byte must at least enter the innermost write-back cache, and the bytes
    beyond what the caches up to a level hold must have entered a level past it, whose rate is at most
    the sum of the rates of that level and those beyond (no inclusivity assumed), so
        write_floor = max over levels k of max(0, output_bytes - capacity below k) / (rates of k and beyond).
    On a GPU: max(output_bytes / (L2 + HBM rates), (output_bytes - L2 bytes) / HBM rate).
    memory = max(write_floor, (input_bytes + output_bytes) / memory_bandwidth): the inputs read and the
    outputs written once at peak bandwidth (after a cache flush every input byte the kernel reads comes
    from DRAM/HBM; output bytes can stay in cache, but this is the conventional roofline, and it only
    marks a suspect: an H200 writing 1-64 MiB after the harness's flush never beat output_bytes / 4.8 TB/s).
    compute = flops / best_compute_flops: the largest peak in any dtype, since an honest kernel may use
    tensor cores, and the output dtype says nothing reliable about the compute dtype (a float32 problem
    may be computed in TF32 or bf16 within tolerance; integer outputs often come from float work).
    """
    levels = peak.write_levels()
    write_floor_s, below = 0.0, 0
    for k, (capacity, _) in enumerate(levels):
        rate = sum(r for _, r in levels[k:])
        write_floor_s = max(write_floor_s, max(0, output_bytes - below) / rate)
        below += capacity
    memory_s = max(write_floor_s, (input_bytes + output_bytes) / peak.memory_bandwidth)
    compute_s = (flops or 0) / peak.best_compute_flops
    return Bounds(
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        flops=flops,
        device=peak.name,
        source=peak.source,
        write_floor_ms=write_floor_s * 1e3,
        memory_ms=memory_s * 1e3,
        compute_ms=compute_s * 1e3,
        roofline_ms=max(memory_s, compute_s) * 1e3,
    )


def assess(runtime_ms: float, b: Bounds) -> tuple[Verdict, float | None]:
    """A measured runtime against a problem's bounds.

    In: runtime_ms (not negative, not NaN), the Bounds. Out: (verdict, fraction), where verdict is
    "impossible" when runtime_ms < write_floor_ms, "suspect" when runtime_ms < roofline_ms, else "ok";
    fraction = roofline_ms / runtime_ms, the achieved fraction of the roofline (1.0 at the roofline,
    inf for a zero runtime), None when roofline_ms is 0.
    """
    if math.isnan(runtime_ms) or runtime_ms < 0:
        raise ValueError(f"not a runtime: {runtime_ms!r} ms")
    if b.roofline_ms <= 0:
        fraction = None
    else:
        fraction = b.roofline_ms / runtime_ms if runtime_ms > 0 else math.inf
    if runtime_ms < b.write_floor_ms:
        return "impossible", fraction
    if runtime_ms < b.roofline_ms:
        return "suspect", fraction
    return "ok", fraction
