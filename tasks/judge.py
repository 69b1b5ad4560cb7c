"""The parent judges: candidate outputs compared with the reference's here, not in the worker.

A candidate runs in the same process as the worker's harness code, so anything the worker decides
a determined candidate could forge (INTEGRITY.md rows 9 and 10). The worker therefore only writes
the candidate's outputs to files; this process, which never runs candidate code, loads them as
plain tensors (raw bytes and a JSON header, harness/tensorfile.py: no pickle, so no code runs) and
compares them with the outputs a separate reference worker wrote. The verdict of `verify` and the
last-timed-output check of `time` are made here. torch is imported on first use: an orchestrator
that judges nothing never loads it.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from kforge.config import RunConfig
from tasks.isolate import Limits, run_worker, scratch_root, worker_pool

# Reference outputs kept on disk for this many (problem, settings) at once, least recently used
# first out: at GPU sizes one problem's outputs can take a few hundred MB.
KEPT_REFERENCES = 16
# Timing inputs: three sets the runs rotate over, and a fourth for the last timed run alone.
TIMING_INPUT_SETS = 4


def _load(path: Path) -> Any:
    from tasks.harness import tensorfile

    return tensorfile.read(path)


def _failure(result: dict[str, Any], outcome: str, error_class: str, excerpt: str) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "error_class": error_class,
        "error_excerpt": excerpt,
        "worker_s": result.get("worker_s"),
    }


def judge_verify(result: dict[str, Any], outputs_dir: Path, expected_dir: Path) -> dict[str, Any]:
    """`correct` with tolerances and max errors, or the first trial's mismatch, for a verify result
    the worker called correct. Every trial the reference has must have a candidate output file."""
    from tasks.harness.checks import compare_outputs, first_error_stats

    trials = sorted(expected_dir.glob("verify_*.json"))
    stats = {"max_abs_err": 0.0, "max_rel_err": 0.0}
    atol = rtol = 0.0
    for trial in range(len(trials)):
        try:
            actual = _load(outputs_dir / f"verify_{trial}.json")
        except Exception as exc:  # noqa: BLE001 - missing or not plain tensors: the harness did not write it
            excerpt = f"no readable output for trial {trial} after a run reported as finished ({type(exc).__name__})"
            return _failure(result, "integrity_violation", "missing_output", excerpt)
        expected = _load(expected_dir / f"verify_{trial}.json")
        mismatch, atol, rtol = compare_outputs(expected, actual)
        if mismatch:
            return _failure(result, mismatch.outcome, mismatch.error_class, f"trial {trial}: {mismatch.report}")
        trial_stats = first_error_stats(expected, actual)
        stats = {key: max(stats[key], trial_stats[key]) for key in stats}
    judged = {key: value for key, value in result.items() if key != "outputs"}
    return {**judged, "trials": len(trials), "atol": atol, "rtol": rtol, **stats}


def judge_time(result: dict[str, Any], outputs_dir: Path, expected_dir: Path) -> dict[str, Any]:
    """The timing result if the output of the candidate's last timed call matches the reference's
    output for the same inputs (INTEGRITY.md row 3); an integrity violation otherwise."""
    from tasks.harness.checks import compare_outputs

    index = result.get("last_input_index")
    expected_path = expected_dir / f"time_{index}.json"
    if not isinstance(index, int) or isinstance(index, bool) or not expected_path.exists():
        return _failure(result, "integrity_violation", "missing_output", f"the timing result names input set {index!r}")
    try:
        actual = _load(outputs_dir / "last_timed.json")
    except Exception as exc:  # noqa: BLE001
        excerpt = f"no readable output of the last timed call after a run reported as finished ({type(exc).__name__})"
        return _failure(result, "integrity_violation", "missing_output", excerpt)
    mismatch, _, _ = compare_outputs(_load(expected_path), actual)
    if mismatch:
        excerpt = f"the output of the last timed call is wrong: {mismatch.report}"
        return _failure(result, "integrity_violation", "last_timed_output", excerpt)
    return {key: value for key, value in result.items() if key not in ("outputs", "last_input_index")}


def _limits(mode: str, config: RunConfig) -> Limits:
    wall_s = config.compile_timeout_s if mode in ("compile", "reference", "baseline") else config.run_timeout_s
    memory_mb = config.memory_limit_mb if config.backend == "cpu" else None
    return Limits(wall_s=wall_s, cpu_s=int(wall_s * 4) + 10, memory_mb=memory_mb)


def _request(mode: str, problem_source: str, candidate_source: str | None, config: RunConfig) -> dict[str, Any]:
    return {
        "mode": mode,
        "problem_source": problem_source,
        "candidate_source": candidate_source,
        "backend": config.backend,
        "size_preset": config.effective_size_preset(),
        "init_seed": config.seeds("init", 1)[0],
        "seeds": config.seeds("verify", config.correctness_trials),
        "time_seeds": config.seeds("time", TIMING_INPUT_SETS),
        "torch_compile": config.torch_compile_baseline,
        "allow_library_calls": config.allow_library_calls,
        "timing": {
            "warmup_runs": config.warmup_runs,
            "min_runs": config.min_timed_runs,
            "max_runs": config.max_timed_runs,
            "budget_s": config.timing_budget_s,
        },
    }


def _run(request: dict[str, Any], config: RunConfig) -> dict[str, Any]:
    pool = worker_pool(config.effective_worker_pool())
    return run_worker(
        request, _limits(request["mode"], config), Path(config.cache_dir) / "kernels", config.threads, pool
    )


class _References:
    """The reference worker's outputs per (problem, run settings), made once in this process and
    kept in a scratch directory removed at exit; entries in use are never evicted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._key_locks: dict[str, threading.Lock] = {}
        self._in_use: dict[str, int] = {}
        self._root: Path | None = None

    def _scratch(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="kforge-expected-", dir=scratch_root()))
            atexit.register(shutil.rmtree, self._root, True)
        return self._root

    def acquire(self, problem_source: str, config: RunConfig) -> tuple[str, dict[str, Any]]:
        request = _request("reference", problem_source, None, config)
        fields = [problem_source, request["backend"], request["size_preset"], request["init_seed"]]
        key = hashlib.sha256(json.dumps([*fields, request["seeds"], request["time_seeds"]]).encode()).hexdigest()[:20]
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
            self._in_use[key] = self._in_use.get(key, 0) + 1
        with key_lock:
            with self._lock:
                entry = self._entries.get(key)
            if entry is None:
                expected_dir = self._scratch() / key
                expected_dir.mkdir(exist_ok=True)
                entry = {**_run({**request, "expected_dir": str(expected_dir)}, config), "dir": str(expected_dir)}
                with self._lock:
                    self._entries[key] = entry
                    self._evict()
            with self._lock:
                self._entries.move_to_end(key)
        return key, entry

    def release(self, key: str) -> None:
        with self._lock:
            self._in_use[key] -= 1
            self._evict()

    def _evict(self) -> None:
        idle = [key for key in self._entries if not self._in_use.get(key)]
        for key in idle[: max(0, len(self._entries) - KEPT_REFERENCES)]:
            shutil.rmtree(self._entries.pop(key)["dir"], ignore_errors=True)


_references = _References()


def evaluate_in_worker(
    mode: str, problem_source: str, candidate_source: str | None, config: RunConfig
) -> dict[str, Any]:
    """Run stage `mode` (compile | verify | time | baseline) of a candidate, or of the reference
    alone, in an isolated worker. verify and time first get the reference's outputs from a
    reference worker (once per problem and run settings), then judge the candidate's outputs here."""
    request = _request(mode, problem_source, candidate_source, config)
    if mode not in ("verify", "time"):
        return _run(request, config)
    key, expected = _references.acquire(problem_source, config)
    try:
        if expected["outcome"] != "correct":
            return {name: expected.get(name) for name in ("outcome", "error_class", "error_excerpt", "worker_s")}
        request.update(
            reference_ops=expected["reference_ops"],
            reference_aliases=expected["reference_aliases"],
            output_bytes=expected["output_bytes"],
        )
        with tempfile.TemporaryDirectory(prefix="kforge-out-", dir=scratch_root()) as outputs_dir:
            result = _run({**request, "outputs_dir": outputs_dir}, config)
            if result["outcome"] != "correct":
                return result
            judge = judge_verify if mode == "verify" else judge_time
            return judge(result, Path(outputs_dir), Path(expected["dir"]))
    finally:
        _references.release(key)
