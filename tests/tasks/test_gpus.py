"""tasks/gpus.py and the per-GPU slots, on the CPU with the GPU count faked where it matters: which GPU
a problem gets, that each GPU has its own timing slot and memory budget, how a worker is bound to its
GPU, and that spares bound to different GPUs of one run are kept."""

import threading
import time
from pathlib import Path

from kforge.config import RunConfig
from tasks import gpus, slots

ROOT = Path(__file__).resolve().parents[2]
GB = 1 << 30


def test_a_run_uses_the_gpus_it_is_given_or_every_visible_one_and_none_on_the_cpu():
    assert gpus.run_gpus("cpu", [0, 1]) == []
    assert gpus.run_gpus("cuda", [2, 0, 2]) == [2, 0]
    assert gpus.run_gpus("cuda", None, visible=4) == [0, 1, 2, 3]
    assert gpus.run_gpus("triton", None, visible=0) == [0]  # a GPU backend without a GPU fails in its stages


def test_problems_in_flight_are_spread_over_the_gpus_and_a_freed_gpu_is_taken_next():
    config = RunConfig(backend="cuda", gpus=[0, 1, 2])
    entered, release = threading.Barrier(9), threading.Event()
    chosen = []

    def problem():
        with gpus.problem_gpu(config) as on_gpu:
            chosen.append(on_gpu.gpu_index)
            entered.wait(10)
            release.wait(10)

    threads = [threading.Thread(target=problem) for _ in range(8)]
    for thread in threads:
        thread.start()
    entered.wait(10)
    assert sorted(gpus.in_flight().items()) == [(0, 3), (1, 3), (2, 2)]
    with gpus.problem_gpu(config) as ninth:  # joins the least busy
        assert ninth.gpu_index == 2 and ninth.gpus == [0, 1, 2]
    release.set()
    for thread in threads:
        thread.join(10)
    assert gpus.in_flight() == {}
    with gpus.problem_gpu(RunConfig(backend="cpu")) as on_cpu:
        assert on_cpu.gpu_index == 0 and on_cpu.gpus is None


def timing_on_gpu_0(order: list[str], done: str) -> threading.Thread:
    """A thread that holds GPU 0's timing slot for 0.4 s, started and inside the slot on return;
    it appends `done` to `order` as it leaves."""
    inside = threading.Event()

    def hold():
        with slots.device_slot("cuda", "time", 0):
            inside.set()
            time.sleep(0.4)
            order.append(done)

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait(10)
    return holder


def test_each_gpu_has_its_own_timing_slot():
    order: list[str] = []
    holder = timing_on_gpu_0(order, "gpu 0 done")
    with slots.device_slot("cuda", "time", 1):  # not blocked by GPU 0's timing
        order.append("gpu 1 timed")
    with slots.device_slot("cuda", "verify", 0):  # waits for it
        order.append("gpu 0 again")
    holder.join(10)
    assert order == ["gpu 1 timed", "gpu 0 done", "gpu 0 again"]


def test_each_gpu_has_its_own_memory_budget():
    with slots.admitted(90 * GB, 100 * GB, gpu=0):
        granted = threading.Event()

        def on_gpu_1():
            with slots.admitted(90 * GB, 100 * GB, gpu=1):
                granted.set()

        thread = threading.Thread(target=on_gpu_1)
        thread.start()
        thread.join(5)
        assert granted.is_set()  # GPU 0's reservation does not count against GPU 1


def test_a_worker_is_bound_to_its_gpu_only_when_the_run_has_more_than_one():
    assert gpus.worker_binding("cuda", 0, [0], None) is None  # one GPU: the environment as it is
    assert gpus.worker_binding("cpu", 1, [0, 1], None) is None
    assert gpus.worker_binding("cuda", 1, [0, 1], "4,5") == "5"  # no UUID seen here: this process's own list
    assert gpus.worker_binding("cuda", 1, [0, 1], None) == "1"
    assert gpus.visible_devices(1, "GPU-1234", "4,5") == "GPU-1234"


def test_the_worker_of_a_stage_on_gpu_1_starts_with_that_gpu_visible_alone(config):
    from tasks.judge import evaluate_in_worker

    problem = (ROOT / "data" / "problems" / "smoke" / "1_relu.py").read_text()
    candidate = 'import os\nraise RuntimeError("visible=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))\n'
    on_gpu_1 = config.model_copy(update={"backend": "cuda", "gpus": [0, 1], "gpu_index": 1, "worker_pool": 0})
    result = evaluate_in_worker("compile", problem, candidate, on_gpu_1)
    assert "visible=1" in result["error_excerpt"], result


def test_spares_bound_to_two_gpus_of_one_run_are_both_kept(tmp_path):
    from tasks.isolate import _worker_env
    from tasks.pool import WorkerPool

    pool = WorkerPool(1)
    try:
        first = pool.take(_worker_env(tmp_path, 1, "0"), "cpu", refill_now=True)
        second = pool.take(_worker_env(tmp_path, 1, "1"), "cpu", refill_now=True)
        deadline = time.monotonic() + 60
        while sum(len(spares) for spares in pool._spares.values()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(pool._spares) == 2 and all(len(spares) == 1 for spares in pool._spares.values())
        pool.take(_worker_env(tmp_path / "another-run", 1, "0"), "cpu", refill_now=False)
        assert len(pool._spares) == 1  # another run's workers: this run's spares are closed
    finally:
        for worker in (first, second):
            worker.process.kill()
        pool.close()


def test_a_torch_compile_baseline_compiles_beside_another_stage_and_times_in_the_slot():
    """Its stage shares the host without the GPU's slot (the first call compiles, for minutes on
    KernelBench's level 3), and takes the slot for its timed calls, behind the stage holding it."""
    order: list[str] = []
    holder = timing_on_gpu_0(order, "candidate timed")
    with slots.device_slot("cuda", slots.COMPILED_BASELINE_MODE, 0):
        order.append("baseline compiled")  # while the candidate still holds the GPU
        with slots.timing_after_setup("cuda", 0):
            order.append("baseline timed")
    holder.join(10)
    assert order == ["baseline compiled", "candidate timed", "baseline timed"]
    with slots.timing_after_setup("cpu"):  # the cpu's stage held its slot from its start
        pass
