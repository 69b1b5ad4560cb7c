"""The parent judges: candidate outputs compared with the reference's here, not in the worker.

A candidate runs in the same process as the worker's harness code, so anything the worker decides
a determined candidate could forge (INTEGRITY.md rows 9 and 10). The worker therefore only hands
its outputs over; this process, which never runs candidate code, compares them with the reference's
outputs, which a trusted worker (the problem's baseline worker, or a reference worker) handed over
the same way. On GPU backends outputs stay on the device: the worker exports CUDA IPC handles and
holds on while this process copies the memory and compares it on the GPU (harness/ipc.py). On the
cpu backend, or where IPC is refused, they are files of raw bytes and a JSON header
(harness/tensorfile.py: no pickle, so no code runs). The verdict of `verify` and the
last-timed-output check of `time` are made here. torch is imported on first use: an orchestrator
that judges nothing never loads it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kforge.config import RunConfig
from tasks.isolate import Limits, run_worker, scratch_root, worker_pool

# Reference outputs kept on disk for this many (problem, settings) at once, least recently used
# first out: at GPU sizes one problem's outputs can take a few hundred MB.
KEPT_REFERENCES = 16
# ... and at most this many bytes of them on the device (IPC handover), beyond those in use.
KEPT_DEVICE_BYTES = 4 << 30
# Timing inputs: three sets the runs rotate over, and a fourth for the last timed run alone.
TIMING_INPUT_SETS = 4


def _failure(result: dict[str, Any], outcome: str, error_class: str, excerpt: str) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "error_class": error_class,
        "error_excerpt": excerpt,
        "worker_s": result.get("worker_s"),
    }


Outputs = Callable[[str], Any]  # an output by name (verify_N, time_N, last_timed), loaded for comparing


def files_in(directory: Path) -> Outputs:
    """Outputs a worker wrote as tensor files into `directory`."""
    from tasks.harness import tensorfile

    return lambda name: tensorfile.read(directory / f"{name}.json")


def handed_over(result: dict[str, Any], directory: Path) -> Outputs:
    """Outputs a worker handed over as IPC handles (result["handover"]), copied into this process's
    device memory while the worker still holds them; any other name from a file in `directory`."""
    headers = result.get("handover") or {}

    def load(name: str) -> Any:
        if name not in headers:
            return files_in(directory)(name)
        import torch

        from tasks.harness import ipc

        return ipc.take(headers[name], torch.device("cuda", torch.cuda.current_device()))

    return load


@contextlib.contextmanager
def _one_host_thread():
    """Host-side comparisons on one intra-op thread. Beside workers that start or run on the same
    cores, torch's OpenMP threads wait on one another: a verify with 1 MB outputs was judged in
    115-636 ms on 2 threads, 15-27 ms on 1 (2-core machine, a spare worker starting meanwhile)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def judge_verify(result: dict[str, Any], actual: Outputs, expected: Outputs, trials: int) -> dict[str, Any]:
    """`correct` with tolerances and max errors, or the first trial's mismatch, for a verify result
    the worker called correct. Every trial the reference has must have a candidate output."""
    start = time.perf_counter()
    with _one_host_thread():
        verdict = _judge_trials(result, actual, expected, trials)
    return {**verdict, "judge_s": time.perf_counter() - start} if verdict["outcome"] == "correct" else verdict


def _judge_trials(result: dict[str, Any], actual: Outputs, expected: Outputs, trials: int) -> dict[str, Any]:
    from tasks.harness.checks import compare_outputs, first_error_stats

    stats = {"max_abs_err": 0.0, "max_rel_err": 0.0}
    atol = rtol = 0.0
    for trial in range(trials):
        try:
            candidate = actual(f"verify_{trial}")
        except Exception as exc:  # noqa: BLE001 - missing or not plain tensors: the harness did not write it
            excerpt = (
                f"no readable output for trial {trial} after a run reported as finished ({type(exc).__name__}: {exc})"
            )
            return _failure(result, "integrity_violation", "missing_output", excerpt)
        reference = expected(f"verify_{trial}")
        mismatch, atol, rtol = compare_outputs(reference, candidate)
        if mismatch:
            return _failure(result, mismatch.outcome, mismatch.error_class, f"trial {trial}: {mismatch.report}")
        trial_stats = first_error_stats(reference, candidate)
        stats = {key: max(stats[key], trial_stats[key]) for key in stats}
    judged = {key: value for key, value in result.items() if key != "handover"}
    return {**judged, "trials": trials, "atol": atol, "rtol": rtol, **stats}


def judge_time(result: dict[str, Any], actual: Outputs, expected: Outputs, timing_sets: int) -> dict[str, Any]:
    """The timing result if the output of the candidate's last timed call matches the reference's
    output for the same inputs (INTEGRITY.md row 3); an integrity violation otherwise."""
    from tasks.harness.checks import compare_outputs

    start = time.perf_counter()
    index = result.get("last_input_index")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < timing_sets:
        return _failure(result, "integrity_violation", "missing_output", f"the timing result names input set {index!r}")
    try:
        candidate = actual("last_timed")
    except Exception as exc:  # noqa: BLE001
        excerpt = (
            f"no readable output of the last timed call after a run reported as finished ({type(exc).__name__}: {exc})"
        )
        return _failure(result, "integrity_violation", "missing_output", excerpt)
    with _one_host_thread():
        mismatch, _, _ = compare_outputs(expected(f"time_{index}"), candidate)
    if mismatch:
        excerpt = f"the output of the last timed call is wrong: {mismatch.report}"
        return _failure(result, "integrity_violation", "last_timed_output", excerpt)
    judged = {key: value for key, value in result.items() if key not in ("handover", "last_input_index")}
    return {**judged, "judge_s": time.perf_counter() - start}


def _limits(mode: str, config: RunConfig) -> Limits:
    wall_s = config.compile_timeout_s if mode in ("compile", "reference", "baseline") else config.run_timeout_s
    on_cpu = config.backend == "cpu"
    return Limits(
        wall_s=wall_s,
        cpu_s=int(wall_s * 4) + 10,
        memory_mb=config.memory_limit_mb if on_cpu else None,
        resident_mb=None if on_cpu else config.memory_limit_mb,
    )


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
        "spare_seed": config.seeds("time-spare", 1)[0],
        "torch_compile": config.torch_compile_baseline,
        "allow_library_calls": config.allow_library_calls,
        "timing": {
            "warmup_runs": config.warmup_runs,
            "min_runs": config.min_timed_runs,
            "max_runs": config.max_timed_runs,
            "budget_s": config.timing_budget_s,
        },
    }


def _run(request: dict[str, Any], config: RunConfig, judge: Callable | None = None) -> dict[str, Any]:
    pool = worker_pool(config.effective_worker_pool())
    limits = _limits(request["mode"], config)
    return run_worker(request, limits, Path(config.cache_dir) / "kernels", config.threads, pool, judge)


def handover_mode(config: RunConfig) -> str:
    """How workers hand outputs to this process: "device" (CUDA IPC, compared on the GPU) on GPU
    backends, "files" on the cpu backend, where KFORGE_OUTPUT_HANDOVER=files says so, or once IPC
    has failed for a reference's outputs in this process (the environment does not allow it)."""
    if config.backend == "cpu" or os.environ.get("KFORGE_OUTPUT_HANDOVER") == "files" or _ipc_unavailable.is_set():
        return "files"
    return "device"


_ipc_unavailable = threading.Event()


class _References:
    """The reference's outputs per (problem, run settings), made once in this process (by the
    problem's baseline worker, or by a reference worker if a candidate comes first) and kept on the
    device (IPC handover) or in a scratch directory removed at exit; entries in use are never evicted."""

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

    @staticmethod
    def key(problem_source: str, config: RunConfig) -> str:
        request = _request("reference", problem_source, None, config)
        fields = [
            problem_source,
            request["backend"],
            request["size_preset"],
            request["init_seed"],
            handover_mode(config),
        ]
        return hashlib.sha256(json.dumps([*fields, request["seeds"], request["time_seeds"]]).encode()).hexdigest()[:20]

    @contextlib.contextmanager
    def _held(self, key: str):
        """The key's lock, with the entry marked in use until the caller is done with it."""
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
            self._in_use[key] = self._in_use.get(key, 0) + 1
        try:
            with key_lock:
                yield
        except BaseException:
            self.release(key)
            raise

    def acquire(self, problem_source: str, config: RunConfig) -> tuple[str, dict[str, Any]]:
        """The entry for this problem and run settings (made now by a reference worker if missing),
        marked in use until `release(key)`."""
        key = self.key(problem_source, config)
        with self._held(key):
            entry = self._get(key)
            if entry is None:
                entry = self._store(key, self._make("reference", problem_source, config, key)[1])
        return key, entry

    def baseline(self, problem_source: str, config: RunConfig) -> dict[str, Any]:
        """The baseline worker's result; while it runs, the reference's outputs are made in the
        same process when this problem has none yet (one process start per problem, not two)."""
        key = self.key(problem_source, config)
        with self._held(key):
            if self._get(key) is not None:
                result = _run(_request("baseline", problem_source, None, config), config)
            else:
                result, entry = self._make("baseline", problem_source, config, key)
                if entry["outcome"] == "correct":
                    self._store(key, entry)
        self.release(key)
        kept = ("reference_ops", "reference_aliases", "output_bytes", "trials", "handover")
        result = {name: value for name, value in result.items() if name not in kept}
        return {**result, "expected_take_s": result.get("expected_take_s", 0.0)} if "expected_s" in result else result

    def _get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def _store(self, key: str, entry: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._entries[key] = entry
            self._evict()
        return entry

    def _make(self, mode: str, problem_source: str, config: RunConfig, key: str) -> tuple[dict, dict]:
        """(the worker's result, the entry) from a `mode` worker told to hand over the reference's outputs."""
        directory = self._scratch() / key
        directory.mkdir(exist_ok=True)
        handover = handover_mode(config)
        request = {
            **_request(mode, problem_source, None, config),
            "expected": True,
            "handover": handover,
            "outputs_dir": str(directory),
        }
        outputs: dict[str, Any] = {}
        if handover == "device":  # this process's CUDA start-up overlaps the worker's run
            warming = threading.Thread(target=_warm_judge_device, name="kforge-warm-judge", daemon=True)
            warming.start()

        def take_outputs(result: dict[str, Any]) -> dict[str, Any]:
            start, load = time.perf_counter(), handed_over(result, directory)
            warming.join()
            try:
                outputs.update({name: load(name) for name in result.get("handover") or {}})
            except Exception as exc:  # noqa: BLE001 - trusted worker: the environment refuses IPC
                return {"outcome": "ipc_failed", "error_excerpt": f"{type(exc).__name__}: {exc}"}
            return {**result, "expected_take_s": time.perf_counter() - start}

        result = _run(request, config, take_outputs if handover == "device" else None)
        if result["outcome"] == "ipc_failed":
            _ipc_unavailable.set()
            logging.getLogger("kforge").warning(
                "kforge: outputs cannot be handed over as CUDA IPC handles here (%s); using files",
                result["error_excerpt"],
            )
            return self._make(mode, problem_source, config, key)
        from_files = files_in(directory)
        entry = {
            **{name: result.get(name) for name in ("outcome", "error_class", "error_excerpt", "worker_s")},
            **{name: result.get(name) for name in ("reference_ops", "reference_aliases", "output_bytes", "trials")},
            "dir": str(directory),
            "outputs": outputs,
            "load": lambda name: outputs[name] if name in outputs else from_files(name),
            "device_bytes": _nbytes(outputs),
        }
        return result, entry

    def release(self, key: str) -> None:
        with self._lock:
            self._in_use[key] -= 1
            self._evict()

    def _evict(self) -> None:
        """Idle entries, least recently used first, past KEPT_REFERENCES or KEPT_DEVICE_BYTES."""
        idle = [key for key in self._entries if not self._in_use.get(key)]
        device_bytes = sum(entry["device_bytes"] for entry in self._entries.values())
        freed = 0
        while idle and (len(self._entries) > KEPT_REFERENCES or device_bytes > KEPT_DEVICE_BYTES):
            entry = self._entries.pop(idle.pop(0))
            device_bytes -= entry["device_bytes"]
            freed += entry["device_bytes"]
            shutil.rmtree(entry["dir"], ignore_errors=True)
        if freed:  # back to the device for the candidates' workers, not kept in this process's cache
            import torch

            torch.cuda.empty_cache()


@functools.cache
def _warm_judge_device() -> None:
    """This process's CUDA context and the comparison's kernels, made once while the first trusted
    worker runs (on an H100 they took about 0.2 s inside the first candidate's judging). A failure
    here shows when the outputs are taken."""
    try:
        import torch

        from tasks.harness.checks import compare_outputs, first_error_stats

        ones = torch.ones(1024, device="cuda")
        compare_outputs(ones, ones.clone())
        first_error_stats(ones, ones)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - no CUDA here: taking the outputs fails and says why
        pass


def _nbytes(outputs: dict[str, Any]) -> int:
    if not outputs:
        return 0
    from tasks.harness.checks import as_tensor_list

    return sum(t.numel() * t.element_size() for output in outputs.values() for t in as_tensor_list(output))


_references = _References()


def evaluate_in_worker(
    mode: str, problem_source: str, candidate_source: str | None, config: RunConfig
) -> dict[str, Any]:
    """Run stage `mode` (compile | verify | time | baseline) of a candidate, or of the reference
    alone, in an isolated worker. verify and time first get the reference's outputs (made once per
    problem and run settings), then judge the candidate's outputs here: on the GPU while the worker
    holds them (IPC handover), or from files after it has gone."""
    if mode == "baseline":
        return _references.baseline(problem_source, config)
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
            handover="device" if expected["outputs"] else "files",
        )
        with tempfile.TemporaryDirectory(prefix="kforge-out-", dir=scratch_root()) as outputs_dir:

            def judge(result: dict[str, Any]) -> dict[str, Any]:
                actual = handed_over(result, Path(outputs_dir))
                if mode == "verify":
                    return judge_verify(result, actual, expected["load"], expected["trials"])
                return judge_time(result, actual, expected["load"], TIMING_INPUT_SETS)

            if request["handover"] == "device":
                return _run({**request, "outputs_dir": outputs_dir}, config, judge)
            result = _run({**request, "outputs_dir": outputs_dir}, config)
            return judge(result) if result["outcome"] == "correct" else result
    finally:
        _references.release(key)
