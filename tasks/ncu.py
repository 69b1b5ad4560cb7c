"""Nsight Compute for the profile stage: the command that wraps a worker, and the report it writes.

`ncu --csv --page details` writes one CSV line per (kernel launch, metric) after its own
`==PROF==` / `==WARNING==` / `==ERROR==` lines; the columns used here are "ID", "Kernel Name",
"Section Name", "Metric Name", "Metric Unit" and "Metric Value" (the others, such as
"Process ID", "Block Size" or a newer version's rule columns, are ignored). A report that is
missing, or a refusal such as ERR_NVGPUCTRPERM (no permission for the performance counters), is a
one-line reason: the caller warns and falls back to torch.profiler (tasks/profile.py).
"""

from __future__ import annotations

import csv
import functools
import io
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

# Section identifiers (`ncu --list-sections`): the few that say what bounds a kernel.
SECTIONS = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "ComputeWorkloadAnalysis",
)
# The details page of these sections names no stall reason on ncu 2025.3 (H200): asked for by name,
# they come back in a section of their own, one ratio per reason (warps stalled per issued instruction).
STALL_METRICS = r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
HEADER_START = '"ID",'
REFUSED = (
    "ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM): load the nvidia module with "
    "NVreg_RestrictProfilingToAdminUsers=0, or run kforge as root"
)
NO_REPORT = "ncu wrote no kernel metrics (no kernel ran between cudaProfilerStart and Stop, or ncu stopped early)"
NEEDED_COLUMNS = ("ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value")


def find_ncu(backend: str) -> str | None:
    """The path of `ncu` where `backend` runs NVIDIA kernels and ncu is on PATH, else None."""
    return shutil.which("ncu") if backend in ("cuda", "triton") else None


@functools.lru_cache(maxsize=4)
def version(ncu: str) -> str:
    """'2024.1.1.0' from `ncu --version` (its last "Version ..." word), or '' where it says none."""
    try:
        text = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.findall(r"Version\s+(\S+)", text)
    return found[-1] if found else ""


def command(ncu: str, report_path: Path, launch_count: int) -> list[str]:
    """The argv prefix that runs a worker under ncu: the sections above, at most `launch_count`
    kernels, only between the worker's cudaProfilerStart and Stop (its one profiled call), the
    GPU's clocks left as they are, the worker's process only, the CSV in `report_path`."""
    sections = [arg for name in SECTIONS for arg in ("--section", name)]
    return [
        ncu,
        "--csv",
        "--page",
        "details",
        *sections,
        "--metrics",
        STALL_METRICS,
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--launch-count",
        str(launch_count),
        # Only the worker: followed into its children (`nvcc --version` at a candidate's import), ncu's
        # injection spun at 100% CPU in the worker, which runs as a user of its own (H200, ncu 2025.3.1).
        "--target-processes",
        "application-only",
        "--log-file",
        str(report_path),
    ]


def refusal(report: str) -> str | None:
    """Why ncu, by `report` (its log file), refused or failed, in one line; None where it says nothing of it."""
    if "ERR_NVGPUCTRPERM" in report:
        return REFUSED
    for line in report.splitlines():
        if line.startswith("==ERROR=="):
            return f"ncu failed: {line.removeprefix('==ERROR==').strip()}"
    return None


def parse_details(report: str, max_launches: int) -> tuple[list[dict[str, Any]], bool]:
    """Rows {kernel, instance (the launch's ID), section, metric, value, unit} of the numeric
    metrics of the first `max_launches` kernel launches in `report` (none without a report), and
    whether launches were left out. Text values (a cache configuration's name, "n/a") are skipped;
    "1,048,576" reads as a number."""
    start = report.find(HEADER_START)
    if start < 0:
        return [], False
    lines = [line for line in report[start:].splitlines() if not line.startswith("==")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    missing = [name for name in NEEDED_COLUMNS if name not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"ncu report lacks the columns {missing}")
    rows, launches = [], []
    for record in reader:
        if record["ID"] not in launches:
            launches.append(record["ID"])
        value = _number(record["Metric Value"])
        if len(launches) > max_launches or value is None or not record["Metric Name"]:
            continue
        rows.append(
            {
                "kernel": record["Kernel Name"],
                "instance": record["ID"],
                "section": record["Section Name"],
                "metric": record["Metric Name"],
                "value": value,
                "unit": record["Metric Unit"] or "",
            }
        )
    return rows, len(launches) > max_launches


def _number(text: str | None) -> float | None:
    try:
        return float((text or "").replace(",", ""))
    except ValueError:
        return None
