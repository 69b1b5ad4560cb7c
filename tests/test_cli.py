"""The `kforge` command as a user runs it: a subprocess, its own ephemeral Prefect server."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llm_server import reply_dir_responder, scripted_openai_server

from kforge import results

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "data" / "problems" / "smoke"


def kforge(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **(env or {}),
    }
    env.pop("PREFECT_API_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "kforge.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900
    )


@pytest.mark.slow
def test_run_smoke_suite_then_report(tmp_path):
    results_dir, cache = tmp_path / "results", tmp_path / "cache"
    run = kforge(
        "run",
        "--suite",
        str(SMOKE),
        "--results",
        str(results_dir),
        "--cache",
        str(cache),
        "--no-torch-compile",
        "--trials",
        "2",
        home=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "No model in use" in run.stdout
    # libkineto's complaint about the thread of the first profiler start (trusted.warm_profiler)
    assert "External init callback" not in run.stdout + run.stderr

    attempts = results.load("attempts", results_dir)
    problem_ids = {path.stem for path in SMOKE.glob("*.py")}
    # not a terminal: one progress line per problem on stderr, in the order they finished
    progress = [line for line in run.stderr.splitlines() if line.split(" ", 1)[0].endswith(f"/{len(problem_ids)}")]
    assert [line.split(" ", 1)[0] for line in progress] == [
        f"{k}/{len(problem_ids)}" for k in range(1, len(problem_ids) + 1)
    ]
    assert {line.split(" ")[1].rstrip(":") for line in progress} == problem_ids
    assert all(": correct " in line and "elapsed" in line for line in progress), progress
    assert set(attempts["problem_id"]) == problem_ids  # every problem has a row
    assert {"correct", "compile_error", "numerical_mismatch", "shape_mismatch"} <= set(attempts["outcome"])
    final = attempts.sort_values("iteration").groupby("problem_id").tail(1)
    assert (final["outcome"] == "correct").all()  # the offline agent ends every smoke problem on a working kernel
    assert attempts["compile_ms"].isna().all() and attempts["eager_ms"].notna().all()
    runs = results.load("runs", results_dir)
    assert runs["status"].tolist() == ["finished"] and runs["torch_version"].notna().all()

    report = kforge("report", "--results", str(results_dir), home=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "fast_1.5" in report.stdout and "geomean_speedup" in report.stdout
    expected = results.report_table(attempts)
    for level, row in expected.iterrows():
        assert f"{row['fast_0']:.3f}" in report.stdout, (level, report.stdout)

    page = tmp_path / "night.html"
    html = kforge("report", "--results", str(results_dir), "--html", str(page), home=tmp_path)
    assert html.returncode == 0, html.stderr
    run_id = runs["run_id"].iloc[0]
    assert f"wrote {page} (run {run_id}; 3 plots and {len(problem_ids)} kernels beside it)" in html.stdout
    assert run_id in page.read_text() and (tmp_path / "night_fast_p.png").stat().st_size > 0


def test_eval_one_candidate(tmp_path):
    run = kforge(
        "eval",
        str(SMOKE / "1_relu.py"),
        str(ROOT / "kernels_ref/cpu/1_relu.py"),
        "--cache",
        str(tmp_path / "cache"),
        home=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "outcome: correct" in run.stdout and "speedup vs eager" in run.stdout

    draft = kforge(
        "eval",
        str(SMOKE / "1_softmax.py"),
        str(ROOT / "kernels_ref/cpu/drafts/1_softmax.0.py"),
        "--cache",
        str(tmp_path / "cache"),
        home=tmp_path,
    )
    assert draft.returncode == 1 and "outcome: numerical_mismatch" in draft.stdout
    assert "max abs err" in draft.stdout


def test_eval_shows_each_stage_and_takes_a_timeout(tmp_path):
    endless = tmp_path / "endless.py"
    endless.write_text(
        "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        while True:\n            pass\n"
    )
    run = kforge(
        "eval",
        str(SMOKE / "1_relu.py"),
        str(endless),
        "--cache",
        str(tmp_path / "cache"),
        "--timeout",
        "4",
        home=tmp_path,
    )

    assert run.returncode == 1 and "outcome: timeout" in run.stdout, run.stdout + run.stderr
    assert "compile ..." in run.stderr and "verify ..." in run.stderr and "time ..." not in run.stderr


def test_bad_input_is_one_clear_line(tmp_path):
    malformed = tmp_path / "bad.py"
    malformed.write_text("def get_inputs(:\n")
    run = kforge("eval", str(malformed), str(ROOT / "kernels_ref/cpu/1_relu.py"), home=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "bad.py" in run.stderr and "syntax error" in run.stderr

    missing = kforge("run", "--suite", str(tmp_path / "nope"), home=tmp_path)
    assert missing.returncode == 2 and "is not a directory" in missing.stderr

    metal = kforge("run", "--backend", "metal", home=tmp_path)
    assert metal.returncode == 2 and "backend: Input should be 'cpu', 'cuda' or 'triton'" in metal.stderr

    empty = kforge("report", "--results", str(tmp_path / "none"), home=tmp_path)
    assert empty.returncode == 2 and "no attempts recorded" in empty.stderr


def test_model_settings_errors_are_one_clear_line_before_anything_runs(tmp_path, unused_port):
    dead_url = f"http://127.0.0.1:{unused_port}/v1"
    dead = kforge("run", "--model", "m", "--base-url", dead_url, "--results", str(tmp_path / "r"), home=tmp_path)
    assert dead.returncode == 2 and dead.stderr.strip().count("\n") == 0
    assert f"model endpoint {dead_url} unreachable" in dead.stderr
    assert not (tmp_path / "r").exists()  # nothing started, nothing half-written

    no_key = kforge("run", "--model", "gpt-x", "--api-key-env", "KFORGE_TEST_UNSET_KEY", home=tmp_path)
    assert no_key.returncode == 2 and "no API key: set KFORGE_TEST_UNSET_KEY" in no_key.stderr

    bad_file = tmp_path / "kforge.yaml"
    bad_file.write_text("llm:\n  modle: x\n")
    misspelt = kforge("run", "--config", str(bad_file), home=tmp_path)
    assert misspelt.returncode == 2 and "llm.modle: Extra inputs are not permitted" in misspelt.stderr


@pytest.mark.slow
def test_run_against_a_local_endpoint_from_a_config_file_and_the_environment(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "1_relu.py").write_text((SMOKE / "1_relu.py").read_text())
    results_dir = tmp_path / "results"
    settings = tmp_path / "kforge.yaml"
    settings.write_text(
        f"suite: {suite}\nresults_dir: {results_dir}\ncache_dir: {tmp_path / 'cache'}\n"
        "torch_compile_baseline: false\niterations: 0\nllm:\n  model: local-coder\n  temperature: 0.0\n"
    )
    with scripted_openai_server(reply_dir_responder(ROOT / "kernels_ref" / "cpu")) as server:
        run = kforge("run", "--config", str(settings), home=tmp_path, env={"KFORGE_BASE_URL": server.base_url})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"Model local-coder at {server.base_url}" in run.stdout and "No model in use" not in run.stdout
    [request] = [r["body"] for r in server.requests if r["body"]]
    assert request["model"] == "local-coder" and request["temperature"] == 0.0
    attempts = results.load("attempts", results_dir)
    row = attempts.iloc[0]
    assert (len(attempts), row["outcome"], row["model"], row["agent"]) == (1, "correct", "local-coder", "llm")
    assert row["tokens_in"] > 0 and row["tokens_out"] > 0
    assert f"model tokens: {row['tokens_in']} in, {row['tokens_out']} out; 0 replies from the cache" in run.stdout


def test_failed_run_then_kforge_retry(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "1_relu.py").write_text((SMOKE / "1_relu.py").read_text())
    results_dir, cache = tmp_path / "results", tmp_path / "cache"
    results_dir.mkdir()
    (results_dir / "attempts").write_text("not a directory: every attempt write fails")
    options = ["--results", str(results_dir), "--cache", str(cache)]

    failed = kforge("run", "--suite", str(suite), "--no-torch-compile", *options, home=tmp_path)
    assert failed.returncode == 2
    error_lines = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, failed.stderr[-3000:]
    error_line = error_lines[0]
    assert "1 problem(s) failed: 1_relu" in error_line and "kforge retry" in error_line
    run_id = error_line.split("kforge retry ")[1].split("`")[0]

    (results_dir / "attempts").unlink()
    retried = kforge("retry", run_id, "--cache", str(cache), home=tmp_path)
    assert retried.returncode == 0, retried.stdout[-2000:] + retried.stderr[-2000:]
    attempts = results.load("attempts", results_dir)
    assert set(attempts["run_id"]) == {run_id}
    assert attempts.sort_values("iteration")["outcome"].tolist() == ["compile_error", "correct"]
    assert "Cached" in retried.stdout + retried.stderr  # the finished stages were replayed, not rerun

    unknown = kforge("retry", "00000000-0000-0000-0000-000000000000", home=tmp_path)
    assert unknown.returncode == 2 and "no kforge run" in unknown.stderr


SLEEPY_PROBLEM = """
import time

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        time.sleep(20)  # every call: a stage in flight for minutes
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_sigterm_ends_the_stages_in_flight_and_records_nothing_unfinished(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "1_sleepy.py").write_text(SLEEPY_PROBLEM)
    (suite / "1_relu.py").write_text((SMOKE / "1_relu.py").read_text())
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    args = ["run", "--suite", str(suite), "--agent", "identity", "--iterations", "0", "--no-torch-compile"]
    args += ["--results", str(tmp_path / "results"), "--cache", str(tmp_path / "cache"), "--parallel-problems", "2"]
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        run = subprocess.Popen([sys.executable, "-m", "kforge.cli", *args], stdout=out, stderr=out, env=env, cwd=ROOT)
        try:
            deadline = time.monotonic() + 300
            while "baseline 1_sleepy" not in log.read_text() and "Task run 'generate 1_sleepy" not in log.read_text():
                assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            time.sleep(3)  # 1_sleepy's baseline stage is in flight: its first call sleeps 20 s, and there are many
            run.send_signal(signal.SIGTERM)
            # Without stopping the workers the run waits for that stage, minutes; the bound is far from both.
            returncode = run.wait(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
    text = log.read_text()
    assert returncode != 0, text[-3000:]
    assert "kforge retry" in text and "termination signal" in text, text[-3000:]
    attempts = results.load("attempts", tmp_path / "results")
    assert "1_sleepy" not in set(attempts.get("problem_id", []))  # nothing recorded of what did not finish
    assert set(attempts.get("outcome", [])) <= {"correct"}  # and 1_relu, if it finished, honestly so
    # and its ephemeral Prefect server ends with it (it used to be left running, parent pid 1)
    deadline = time.monotonic() + 15
    while (left := prefect_servers(tmp_path / "prefect")) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"Prefect servers left running after kforge ended: {left}"


def prefect_servers(prefect_home: Path) -> list[int]:
    """The pids of Prefect ephemeral servers (uvicorn) started under this PREFECT_HOME."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline, environ = (proc / "cmdline").read_bytes(), (proc / "environ").read_bytes()
        except OSError:  # gone meanwhile
            continue
        home = b"\0PREFECT_HOME=" + str(prefect_home).encode() + b"\0"
        if b"prefect.server.api.server:create_app" in cmdline and home in b"\0" + environ + b"\0":
            found.append(int(proc.name))
    return found
