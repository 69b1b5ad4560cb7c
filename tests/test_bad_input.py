"""Bad input stays one line: exit status 2, a first line naming what to fix, nothing recorded lost."""

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kforge import results
from kforge.results import append_rows

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "data" / "problems" / "smoke"


def kforge(*args: str, home: Path, prelude: str = "") -> subprocess.CompletedProcess:
    """`kforge ARGS` in a subprocess; `prelude` runs first (e.g. to make an import fail)."""
    env = {**os.environ, "PREFECT_HOME": str(home / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    code = f"import sys\n{prelude}\nfrom kforge.cli import main\nsys.argv = ['kforge', *sys.argv[1:]]\nmain()\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )


def first_line(run: subprocess.CompletedProcess) -> str:
    return run.stderr.splitlines()[0] if run.stderr else ""


@pytest.fixture
def recorded(tmp_path) -> Path:
    """A results directory holding one recorded attempt."""
    row = {
        "attempt_id": "a1",
        "problem_id": "1_relu",
        "suite": "smoke",
        "backend": "cpu",
        "level": 1,
        "outcome": "correct",
        "speedup_eager": 2.0,
        "created_at": datetime(2025, 3, 14, tzinfo=timezone.utc),
    }
    append_rows(tmp_path / "results", "attempts", [row], run_id="run-1")
    return tmp_path / "results"


def files_under(directory: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(directory)), p.stat().st_size) for p in directory.rglob("*") if p.is_file())


def test_report_by_an_unknown_column_lists_the_valid_ones(recorded, tmp_path):
    before = files_under(recorded)
    run = kforge("report", "--results", str(recorded), "--by", "level,NO_SUCH_COLUMN", home=tmp_path)
    columns = ", ".join(results.load("attempts", recorded).columns)
    assert run.returncode == 2
    assert first_line(run) == f"error: --by NO_SUCH_COLUMN: no such column; valid columns: {columns}"
    assert run.stderr.count("\n") == 1 and "problem_id" in columns
    assert files_under(recorded) == before


def test_report_with_a_bogus_baseline_names_the_three(recorded, tmp_path):
    run = kforge("report", "--results", str(recorded), "--baseline", "BOGUS", home=tmp_path)
    assert (run.returncode, first_line(run)) == (2, "error: --baseline 'BOGUS': use one of eager, compile, best")
    assert run.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (
            b"class ModelNew:\x00\x01\x02",
            "the candidate is a binary file (NUL bytes), not Python source defining ModelNew",
        ),
        (
            "caf\u00e9 = 1\n".encode("latin-1"),
            "the candidate is not UTF-8 text (byte 0xe9 at offset 3); save it as UTF-8 Python source",
        ),
    ],
    ids=["binary", "latin-1"],
)
def test_eval_of_an_unreadable_candidate_names_the_candidate_file(tmp_path, content, reason):
    candidate = tmp_path / "candidate.py"
    candidate.write_bytes(content)
    run = kforge("eval", str(SMOKE / "1_relu.py"), str(candidate), "--cache", str(tmp_path / "cache"), home=tmp_path)
    assert (run.returncode, first_line(run)) == (2, f"error: {candidate}: {reason}")
    assert run.stderr.count("\n") == 1 and "1_relu" not in run.stderr


def test_run_into_a_results_directory_that_cannot_be_written_stops_before_evaluating(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the results directory's parent should be")
    results_dir = blocker / "results"
    run = kforge(
        "run", "--suite", str(SMOKE), "--results", str(results_dir), "--cache", str(tmp_path / "c"), home=tmp_path
    )
    assert run.returncode == 2
    assert first_line(run) == (
        f"error: results directory {results_dir} cannot be written ({blocker} is not a folder): "
        "give --results a writable folder"
    )
    assert run.stderr.count("\n") == 1 and run.stdout == ""  # no agent notice: nothing started
    assert not (tmp_path / "c").exists() and not (tmp_path / "prefect").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_run_into_a_read_only_results_directory_stops_before_evaluating(tmp_path):
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    results_dir.chmod(0o555)
    try:
        run = kforge("run", "--suite", str(SMOKE), "--results", str(results_dir), home=tmp_path)
    finally:
        results_dir.chmod(0o755)
    assert run.returncode == 2
    assert first_line(run) == (
        f"error: results directory {results_dir} cannot be written (Permission denied): "
        "give --results a writable folder"
    )


def test_model_without_the_llm_extra_says_how_to_install_it(tmp_path):
    # An install without the extra: the import system treats a None entry in sys.modules as "not installed".
    shim = "sys.modules['openai'] = None\nsys.modules['langchain_openai'] = None"
    run = kforge("run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", home=tmp_path, prelude=shim)
    assert run.returncode == 2
    assert first_line(run) == "error: a model needs the llm extra (openai is not installed): pip install -e '.[llm]'"
    assert run.stderr.count("\n") == 1


def test_grid_whose_every_combination_needs_a_model_refuses_with_a_reason_each(tmp_path):
    run = kforge(
        "grid", "--performance-agent", "on", "--iterations", "0,1", "--results", str(tmp_path / "r"), home=tmp_path
    )
    assert run.returncode == 2
    assert run.stdout.splitlines() == [
        f"skipped model=None iterations={n} reference_backend=None performance_agent=on: "
        "the performance agent needs a model (give --models NAME)"
        for n in (0, 1)
    ]
    assert first_line(run) == "error: none of the 2 combinations can run as asked (see the lines above)"
    assert not (tmp_path / "r").exists()
