"""Distillation: a profile's hundreds of metrics as the few the agents read.

`distil(row, profile_rows)` reads an attempt's row and its `profiles` rows (tasks/profile.py) through
data/profile_metrics.json, which says which Nsight Compute (section, metric) pairs are kept, the name the
model and the knowledge base's state rules see, and how units convert. Out come a `Distilled`: the metrics
the rules read (data/knowledge/seed.json), further metrics for the model only, each kernel's share of the
kernel time with its speed-of-light compute and memory %, the occupancy limiter (the smallest "Block Limit"),
the stall reasons where the profile has them, DRAM bytes against the minimum the problem must move, and
notes on what is missing. `summary_text` writes that in a few lines for agent G; `png_bytes`/`render_png`
draw it as a chart for multimodal models (matplotlib, the `report` extra).

Everything is a duration-weighted mean over the kernel launches: a 50 us GEMM counts more than a 7 us
reduction. A unit the metrics file does not list is a note and the value is left out, never read as-is.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from tasks.profile import NCU_LAUNCHES

METRICS_PATH = Path(__file__).resolve().parents[1] / "data" / "profile_metrics.json"
NO_CHART = (
    "matplotlib is not installed: pip install 'kforge[report]' to send profile charts (--profile-format image|both)"
)


class MetricsFileError(ValueError):
    """data/profile_metrics.json (or the file given) is not valid; the message is one line naming it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Converted(_Strict):
    section: str
    metric: str
    as_unit: str
    units: dict[str, float]  # the unit ncu prints -> factor into as_unit


class KeptMetric(Converted):
    name: str  # as the model and the state rules see it
    rules: bool  # in Distilled.metrics (the rules read it) or only in Distilled.shown
    description: str


class Limiters(_Strict):
    section: str
    metrics: dict[str, str]  # "Block Limit Registers" -> "registers"


class Stalls(_Strict):
    section: str  # ncu 2025.3 puts the metrics asked for by name (tasks/ncu.py STALL_METRICS) in a section of their own
    metric_contains: str
    name_prefix: str = ""  # cut from the metric's name for the model: "long_scoreboard", not smsp__...
    name_suffix: str = ""
    unit: str = ""
    not_stalls: list[str] = []  # "selected": the warp issuing, 1 per instruction by definition


class NcuSpec(_Strict):
    duration: Converted
    dram_bytes_per_second: Converted
    speed_of_light: dict[Literal["compute", "memory"], str]  # names of kept metrics
    metrics: list[KeptMetric]
    occupancy_limiters: Limiters
    stall_reasons: Stalls


class TorchSpec(_Strict):
    sections: dict[Literal["kernels", "ops"], str]
    time_metric: str
    calls_metric: str


class SummarySpec(_Strict):
    max_kernels: int
    max_stall_reasons: int
    max_name_chars: int


class MetricsSpec(_Strict):
    about: str = ""
    ncu: NcuSpec
    torch: TorchSpec
    summary: SummarySpec


@functools.lru_cache(maxsize=4)
def load_spec(path: Path = METRICS_PATH) -> MetricsSpec:
    """The metrics file at `path`. Raises MetricsFileError (one line naming the file) when it is unreadable,
    not JSON, or not of the shape above."""
    try:
        spec = MetricsSpec.model_validate_json(Path(path).read_text())
    except OSError as exc:
        raise MetricsFileError(f"{path}: cannot be read ({exc.strerror}); restore it with git") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the document"
        raise MetricsFileError(
            f"{path}: {where}: {first['msg']} ({exc.error_count()} problem(s)); fix it or restore it with git"
        ) from None
    names = {m.name for m in spec.ncu.metrics}
    if unknown := sorted(set(spec.ncu.speed_of_light.values()) - names):
        raise MetricsFileError(f"{path}: ncu.speed_of_light names {unknown}, which ncu.metrics does not keep")
    return spec


@dataclass(frozen=True)
class KernelTime:
    name: str
    launches: int
    duration_us: float | None  # all its launches together; None where a launch has no duration
    share: float | None  # of the profile's kernel time
    compute_pct: float | None = None  # speed of light, % of peak (ncu only)
    memory_pct: float | None = None
    limiter: str | None = None  # of its longest launch (ncu only)


@dataclass(frozen=True)
class Distilled:
    tool: str  # "ncu", "torch.profiler", or "" without a profile
    tool_version: str
    metrics: dict[str, float]  # what the state rules read (data/knowledge/seed.json's names)
    shown: dict[str, float]  # further kept metrics, for the model only
    kernels: tuple[KernelTime, ...]  # most time first
    limiter: str | None  # the occupancy limiter of the kernel with the most time
    stall_reasons: tuple[tuple[str, float], ...]  # largest first
    dram_bytes: float | None
    min_bytes: float | None
    notes: tuple[str, ...]


def distil(
    row: dict[str, Any],
    profile_rows: list[dict[str, Any]],
    min_bytes: float | None = None,
    spec: MetricsSpec | None = None,
) -> Distilled:
    """The distilled profile of one attempt: `row` its attempts row (runtime_ms, speedup_eager,
    roofline_fraction), `profile_rows` its `profiles` rows (ncu or torch.profiler; none when not profiled),
    `min_bytes` the bytes the problem must move at least (its inputs and outputs), when known."""
    spec = spec or load_spec()
    metrics = {
        name: float(row[column])
        for name, column in (("runtime_ms", "runtime_ms"), ("speedup_eager", "speedup_eager"))
        if row.get(column) is not None
    }
    if row.get("roofline_fraction") is not None:
        metrics["roofline_pct"] = 100.0 * float(row["roofline_fraction"])
    ncu_rows = [r for r in profile_rows if r.get("tool") == "ncu"]
    if ncu_rows:
        found = _ncu(ncu_rows, spec.ncu, row.get("runtime_ms"), min_bytes)
    elif profile_rows:
        found = _torch(profile_rows, spec.torch, row.get("runtime_ms"))
    else:
        found = _Found(notes=["no profile: the attempt was not profiled, or the profiler gave nothing"])
    version = next((str(r["tool_version"]) for r in profile_rows if r.get("tool_version")), "")
    tool = str(profile_rows[0].get("tool") or "") if profile_rows else ""
    return Distilled(
        tool="ncu" if ncu_rows else tool,
        tool_version=version,
        metrics=metrics | found.metrics,
        shown=found.shown,
        kernels=tuple(sorted(found.kernels, key=lambda k: -(k.duration_us or 0.0))),
        limiter=found.limiter,
        stall_reasons=tuple(found.stalls[: spec.summary.max_stall_reasons]),
        dram_bytes=found.dram_bytes,
        min_bytes=min_bytes,
        notes=tuple(dict.fromkeys(found.notes)),
    )


@dataclass
class _Found:
    metrics: dict[str, float] = field(default_factory=dict)
    shown: dict[str, float] = field(default_factory=dict)
    kernels: list[KernelTime] = field(default_factory=list)
    limiter: str | None = None
    stalls: list[tuple[str, float]] = field(default_factory=list)
    dram_bytes: float | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- Nsight Compute


def _ncu(rows: list[dict[str, Any]], spec: NcuSpec, runtime_ms: float | None, min_bytes: float | None) -> _Found:
    notes: list[str] = []
    launches: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        launches.setdefault(str(r["instance"]), []).append(r)

    def read(launch: list[dict[str, Any]], entry: Converted) -> float | None:
        matching = [
            r for r in launch if r["metric"] == entry.metric and r.get("section", entry.section) == entry.section
        ]
        for r in matching:
            if (factor := entry.units.get(r.get("unit") or "")) is not None:
                return float(r["value"]) * factor
        if matching:
            notes.append(
                f"{entry.metric} in unit {matching[0].get('unit')!r}, not listed in the metrics file: left out"
            )
        return None

    durations = {key: read(launch, spec.duration) for key, launch in launches.items()}
    if any(d is None for d in durations.values()):
        notes.append("a launch has no Duration: launches weigh the same and time shares are unknown")
        weights = dict.fromkeys(launches, 1.0)
    else:
        weights = {key: float(d) for key, d in durations.items()}
    values = {m.name: {key: read(launch, m) for key, launch in launches.items()} for m in spec.metrics}

    found = _Found(metrics={"kernel_launches": float(len(launches))}, notes=notes)
    for m in spec.metrics:
        mean = _weighted(values[m.name], weights)
        if mean is not None:
            (found.metrics if m.rules else found.shown)[m.name] = mean

    total_us = sum(weights.values()) if None not in durations.values() else None
    if total_us and runtime_ms:
        if len(launches) >= NCU_LAUNCHES:
            notes.append(f"ncu profiles at most {NCU_LAUNCHES} launches: the launch overhead is not computed")
        else:
            found.metrics["launch_overhead_pct"] = max(0.0, 100.0 * (1.0 - total_us / 1e3 / runtime_ms))

    rates = {key: read(launch, spec.dram_bytes_per_second) for key, launch in launches.items()}
    if total_us and None not in rates.values():
        found.dram_bytes = sum(float(rates[key]) * weights[key] * 1e-6 for key in launches)
        if min_bytes:
            found.metrics["dram_bytes_ratio"] = found.dram_bytes / min_bytes

    limiters = {key: _limiter(launch, spec.occupancy_limiters) for key, launch in launches.items()}
    found.kernels = _kernels(launches, weights, values, limiters, spec.speed_of_light, total_us)
    if found.kernels:
        found.limiter = max(found.kernels, key=lambda k: k.duration_us or 0.0).limiter

    stall_names = {
        r["metric"]
        for r in rows
        if r.get("section") == spec.stall_reasons.section
        and spec.stall_reasons.metric_contains.lower() in r["metric"].lower()
    }
    for name in stall_names:
        per_launch = {key: _first(launch, spec.stall_reasons.section, name) for key, launch in launches.items()}
        if (mean := _weighted(per_launch, weights)) is not None:
            shown = name.removeprefix(spec.stall_reasons.name_prefix).removesuffix(spec.stall_reasons.name_suffix)
            if shown not in spec.stall_reasons.not_stalls:
                found.stalls.append((shown, mean))
    found.stalls.sort(key=lambda pair: -pair[1])
    if not stall_names:
        notes.append(f"no stall reasons in the profile (no '{spec.stall_reasons.section}' metric names a stall)")
    return found


def _kernels(launches, weights, values, limiters, speed_of_light, total_us) -> list[KernelTime]:
    groups: dict[str, list[str]] = {}
    for key, launch in launches.items():
        groups.setdefault(str(launch[0].get("kernel") or f"launch {key}"), []).append(key)
    kernels = []
    for name, keys in groups.items():
        duration = sum(weights[k] for k in keys) if total_us else None
        sol = {
            side: _weighted({k: values[metric][k] for k in keys}, weights) for side, metric in speed_of_light.items()
        }
        longest = max(keys, key=lambda k: weights[k])
        share = duration / total_us if duration is not None and total_us else None
        kernels.append(
            KernelTime(name, len(keys), duration, share, sol.get("compute"), sol.get("memory"), limiters[longest])
        )
    return kernels


def _limiter(launch: list[dict[str, Any]], spec: Limiters) -> str | None:
    """The resource whose "Block Limit" is smallest (ties all named), with that limit."""
    limits = {label: _first(launch, spec.section, metric) for metric, label in spec.metrics.items()}
    known = {label: value for label, value in limits.items() if value is not None}
    if not known:
        return None
    least = min(known.values())
    names = " and ".join(label for label, value in known.items() if value == least)
    return f"{names} ({least:g} block{'' if least == 1 else 's'} per SM)"


def _first(launch: list[dict[str, Any]], section: str, metric: str) -> float | None:
    for r in launch:
        if r["metric"] == metric and r.get("section", section) == section:
            return float(r["value"])
    return None


def _weighted(values: dict[str, float | None], weights: dict[str, float]) -> float | None:
    known = [(v, weights[key]) for key, v in values.items() if v is not None]
    total = sum(w for _, w in known)
    return sum(v * w for v, w in known) / total if known and total > 0 else None


# ---------------------------------------------------------------- torch.profiler


def _torch(rows: list[dict[str, Any]], spec: TorchSpec, runtime_ms: float | None) -> _Found:
    """Launch and op counts; on a GPU the share of the runtime no kernel ran in; time shares per kernel
    (per op on the CPU)."""
    notes = ["torch.profiler measures times and calls only: no throughput, occupancy or stall counters"]

    def total(section: str, metric: str) -> float:
        return sum(float(r["value"]) for r in rows if r.get("section") == section and r.get("metric") == metric)

    kernels_section, ops_section = spec.sections["kernels"], spec.sections["ops"]
    if not any(r.get("metric") == spec.calls_metric for r in rows):
        return _Found(notes=notes)
    metrics = {"cpu_op_calls": total(ops_section, spec.calls_metric)}
    has_kernels = any(r.get("section") == kernels_section and r.get("metric") == spec.calls_metric for r in rows)
    if has_kernels:
        metrics["kernel_launches"] = total(kernels_section, spec.calls_metric)
        if runtime_ms:
            busy_ms = total(kernels_section, spec.time_metric) / 1e3
            metrics["launch_overhead_pct"] = max(0.0, 100.0 * (1.0 - busy_ms / runtime_ms))
    timed = kernels_section if has_kernels else ops_section
    times: dict[str, list[float]] = {}
    for r in rows:
        if r.get("section") == timed and r.get("metric") in (spec.time_metric, spec.calls_metric):
            entry = times.setdefault(str(r.get("kernel") or "(unnamed)"), [0.0, 0.0])
            entry[r["metric"] == spec.calls_metric] += float(r["value"])
    all_us = sum(us for us, _ in times.values())
    kernels = [KernelTime(name, int(calls), us, us / all_us if all_us else None) for name, (us, calls) in times.items()]
    return _Found(metrics=metrics, kernels=kernels, notes=notes)


# ---------------------------------------------------------------- for the agents


def summary_text(distilled: Distilled, spec: MetricsSpec | None = None) -> str:
    """The distilled profile in a few lines for agent G: counters, limiter, stalls, DRAM bytes, kernels."""
    spec = spec or load_spec()
    if not distilled.tool:
        return "No profile."
    values = distilled.metrics | distilled.shown
    total_us = sum(k.duration_us or 0.0 for k in distilled.kernels)
    launches = sum(k.launches for k in distilled.kernels)
    head = (
        f"{distilled.tool} {distilled.tool_version}".strip() + f": {_launches(launches)}, {total_us:.4g} us in kernels"
    )
    if "runtime_ms" in values:
        head += f", {values['runtime_ms']:.4g} ms per call"
    if "launch_overhead_pct" in values:
        head += f" ({values['launch_overhead_pct']:.3g}% of it outside kernels)"
    lines = [head]
    lines += [f"- {m.description}: {values[m.name]:.3g}" for m in spec.ncu.metrics if m.name in values]
    if distilled.limiter:
        lines.append(f"- occupancy limiter of the longest kernel: {distilled.limiter}")
    if distilled.stall_reasons:
        lines.append(
            "- top stall reasons"
            + (f" ({spec.ncu.stall_reasons.unit})" if spec.ncu.stall_reasons.unit else "")
            + ": "
            + ", ".join(f"{name} {value:.3g}" for name, value in distilled.stall_reasons)
        )
    if distilled.dram_bytes is not None:
        moved = f"- DRAM traffic: {distilled.dram_bytes / 1e6:.4g} MB"
        if distilled.min_bytes:
            ratio = distilled.dram_bytes / distilled.min_bytes
            moved += f", {ratio:.3g}x the {distilled.min_bytes / 1e6:.4g} MB the problem must move"
        lines.append(moved)
    lines.append("Time per kernel:")
    shown = distilled.kernels[: spec.summary.max_kernels]
    lines += [f"- {_kernel_line(k, spec.summary.max_name_chars)}" for k in shown]
    if rest := distilled.kernels[len(shown) :]:
        lines.append(f"- {len(rest)} more kernels, {100 * sum(k.share or 0.0 for k in rest):.3g}% of the time")
    lines += [f"Note: {note}" for note in distilled.notes]
    return "\n".join(lines)


def _kernel_line(kernel: KernelTime, max_chars: int) -> str:
    share = f"{100 * kernel.share:.3g}%" if kernel.share is not None else "?%"
    duration = f"{kernel.duration_us:.4g} us" if kernel.duration_us is not None else "? us"
    parts = [f"{share} {duration} {_short(kernel.name, max_chars)} ({_launches(kernel.launches)})"]
    if kernel.compute_pct is not None or kernel.memory_pct is not None:
        parts.append(f"speed of light compute {_pct(kernel.compute_pct)}, memory {_pct(kernel.memory_pct)}")
    if kernel.limiter:
        parts.append(f"limiter {kernel.limiter}")
    return "; ".join(parts)


def _launches(count: int) -> str:
    return f"{count} launch" if count == 1 else f"{count} launches"


def _short(name: str, max_chars: int) -> str:
    name = name.removeprefix("void ")
    return name if len(name) <= max_chars else name[: max_chars - 3] + "..."


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}%"


def require_matplotlib() -> None:
    """Raises RuntimeError (one line, what to install) when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RuntimeError(NO_CHART) from None


def png_bytes(distilled: Distilled, spec: MetricsSpec | None = None) -> bytes:
    """A PNG chart: each kernel's share of the kernel time, and its speed-of-light compute and memory % of
    peak. The same profile gives the same bytes (no timestamp or version in the file)."""
    require_matplotlib()
    from matplotlib.figure import Figure

    spec = spec or load_spec()
    kernels = distilled.kernels[: spec.summary.max_kernels] or (KernelTime("(no kernels)", 0, None, None),)
    labels = [_short(k.name, 40) for k in kernels][::-1]
    figure = Figure(figsize=(11, 1.6 + 0.55 * len(kernels)), dpi=100, layout="constrained")
    share_axes, sol_axes = figure.subplots(1, 2, sharey=True)
    positions = list(range(len(kernels)))
    bars = share_axes.barh(positions, [100 * (k.share or 0.0) for k in kernels][::-1], color="tab:gray")
    share_axes.bar_label(bars, [f"{k.duration_us:.4g} us" if k.duration_us else "" for k in kernels][::-1], padding=3)
    # room past 100% for the label of a kernel that takes nearly all the time (it ran into the next chart)
    share_axes.set(yticks=positions, yticklabels=labels, xlim=(0, 130), xlabel="% of kernel time")
    share_axes.set_xticks(range(0, 101, 20))
    share_axes.set_title("time per kernel")
    compute = [k.compute_pct or 0.0 for k in kernels][::-1]
    memory = [k.memory_pct or 0.0 for k in kernels][::-1]
    sol_axes.barh([p + 0.2 for p in positions], compute, height=0.4, label="compute (SM)", color="tab:blue")
    sol_axes.barh([p - 0.2 for p in positions], memory, height=0.4, label="memory", color="tab:orange")
    sol_axes.set(xlim=(0, 100), xlabel="% of peak")
    sol_axes.set_title("speed of light")
    if any(k.compute_pct is not None or k.memory_pct is not None for k in kernels):
        sol_axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over one
    else:
        sol_axes.text(50, (len(kernels) - 1) / 2, f"no counters ({distilled.tool or 'no profile'})", ha="center")
    figure.suptitle(f"{distilled.tool} {distilled.tool_version}".strip() or "no profile")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def render_png(distilled: Distilled, path: str | Path, spec: MetricsSpec | None = None) -> Path:
    """`png_bytes` written to `path`; the path."""
    path = Path(path)
    path.write_bytes(png_bytes(distilled, spec))
    return path
