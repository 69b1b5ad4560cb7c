"""Tests for kforge.htmlreport (`kforge report --html`) on result tables written with kforge.results.append_rows:
the page's numbers against kforge.results, its files, and the page as headless Chromium renders it."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import markupsafe
import pytest

from kforge import results
from kforge.htmlreport import HtmlReport, ReportError, group_label, write_html_report
from kforge.results import append_rows

T0 = datetime(2025, 3, 14, 12, 0, tzinfo=timezone.utc)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SCREENSHOT_COPY = Path("/tmp/kforge_report_screenshot.png")
FACTS = {
    "host": "gpu-box-7",
    "device": "cuda",
    "gpu_name": "NVIDIA H200",
    "driver": "550.54.15",
    "torch_version": "2.5.1+cu124",
    "python_version": "3.11.9",
    "toolchain": {"nvcc": "12.4.131", "gxx": "12.2.0"},
}
RELU_BEST = "# relu, iteration 2\nclass ModelNew: ...\n"


def write_run(results_dir: Path, run_id: str, attempts: list[dict], hours: float) -> None:
    """One finished run as the suite flow records it: a 'running' row, the attempts, the final row."""
    started = T0 + timedelta(hours=hours)
    config = {"suite": "data/problems/smoke", "backend": "triton", "llm": {"model": "gpt-x"}}
    common = {"config": config, "started_at": started, "git_sha": "abc123", **FACTS}
    append_rows(results_dir, "runs", [{**common, "status": "running"}], run_id=run_id, run_date=started.date())
    rows = [
        {
            "attempt_id": f"{run_id}-{index}",
            "suite": "smoke",
            "backend": "triton",
            "device": "cuda",
            "model": "gpt-x",
            "created_at": started + timedelta(minutes=index + 1),
            **attempt,
        }
        for index, attempt in enumerate(attempts)
    ]
    append_rows(results_dir, "attempts", rows, run_id=run_id, run_date=started.date())
    final = {**common, "status": "finished", "finished_at": started + timedelta(hours=1)}
    append_rows(results_dir, "runs", [final], run_id=run_id, run_date=date(2025, 3, 14))


def correct(problem_id: str, level: int, speedup: float, source: str = "class ModelNew: ...\n") -> dict:
    """A correct attempt timed at 1 ms with a +-5% spread, so its speedup's noise interval is known."""
    return {
        "problem_id": problem_id,
        "level": level,
        "outcome": "correct",
        "candidate_source": source,
        "speedup_eager": speedup,
        "speedup_best": speedup,
        "runtime_ms": 1.0,
        "runtime_p10_ms": 0.95,
        "runtime_p90_ms": 1.05,
        "eager_ms": speedup,
    }


def failing(problem_id: str, level: int, outcome: str, source: str | None = "class ModelNew: broken\n") -> dict:
    return {
        "problem_id": problem_id,
        "level": level,
        "outcome": outcome,
        "error_class": "x",
        "candidate_source": source,
    }


# Run B, the one reported (level 1: relu, softmax, matmul; level 2: conv_relu, gemm_add, layernorm):
#   correct problems 4 of 6; fast_1 = 3/6 overall, 1/3 at level 1, 2/3 at level 2.
RUN_A = [
    correct("1_relu", 1, 2.0),
    correct("1_softmax", 1, 0.8),
    correct("1_matmul", 1, 1.5),
    failing("2_conv_relu", 2, "compile_error"),
    correct("2_layernorm", 2, 3.2),
]
RUN_B = [
    failing("1_relu", 1, "compile_error"),
    correct("1_relu", 1, 1.8),
    correct("1_relu", 1, 2.5, source=RELU_BEST),  # the best attempt: faster than run A beyond the noise
    correct("1_softmax", 1, 0.8),
    failing("1_matmul", 1, "numerical_mismatch"),
    failing("1_matmul", 1, "runtime_error"),  # the last attempt: the problem's outcome, a new failure
    correct("2_conv_relu", 2, 1.25),  # fixed
    failing("2_gemm_add", 2, "generation_failed", source=None),
    correct("2_layernorm", 2, 3.2),
]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    results_dir = tmp_path_factory.mktemp("results")
    write_run(results_dir, "run-a", RUN_A, hours=0)
    write_run(results_dir, "run-b", RUN_B, hours=2)
    return results_dir


@pytest.fixture(scope="module")
def report(two_runs, tmp_path_factory) -> HtmlReport:
    """The report of the latest run, written once for the tests that only read it (a report takes ~2 s)."""
    return write_html_report(two_runs, tmp_path_factory.mktemp("out") / "report.html")


def test_numbers_match_kforge_results(report, two_runs):
    attempts = results.load("attempts", two_runs)
    run_b = attempts[attempts["run_id"] == "run-b"]
    assert report.run_id == "run-b"  # the newest run
    assert len(report.ps) == 41 and report.ps[0] == 0 and report.ps[-1] == 4
    for p_index, p in enumerate(report.ps):
        expected = results.fast_p(run_b, p, by=["level", "backend", "model"])
        for key, value in expected.items():
            assert report.fast_p[group_label(key)][p_index] == pytest.approx(value)
        assert report.fast_p["all problems"][p_index] == pytest.approx(results.fast_p(run_b, p))
    level_1, level_2 = group_label((1, "triton", "gpt-x")), group_label((2, "triton", "gpt-x"))
    assert report.summary[level_1]["fast_1"] == pytest.approx(1 / 3)
    assert report.summary[level_2]["fast_1"] == pytest.approx(2 / 3)
    assert report.summary["all problems"]["fast_1"] == pytest.approx(0.5)
    assert report.correct_problems == 4
    assert report.best_outcomes["runtime_error"] == 1 and report.best_outcomes["generation_failed"] == 1
    assert sum(report.all_outcomes.values()) == len(RUN_B) and report.all_outcomes["correct"] == 5
    by_id = {p.problem_id: p for p in report.problems}
    assert by_id["1_relu"].speedup == pytest.approx(2.5) and by_id["1_relu"].attempts == 3
    assert by_id["1_matmul"].outcome == "runtime_error" and by_id["1_matmul"].speedup is None
    assert report.compared_with == "run-a" and report.comparison_note is None


def test_page_is_self_contained_with_pngs_and_kernels_beside_it(report):
    assert [p.name for p in report.png_paths] == ["report_fast_p.png", "report_speedups.png", "report_outcomes.png"]
    for png in report.png_paths:
        assert png.read_bytes().startswith(PNG_MAGIC)
    page = report.page_path.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    sources = re.findall(r"""<img[^>]*\ssrc="([^"]*)\"""", page)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    # The best kernel of 1_relu is written beside the page and linked relatively; generation_failed has no source.
    relu = next(p for p in report.problems if p.problem_id == "1_relu")
    assert relu.kernel_href == "report_kernels/1_relu.py" and f'href="{relu.kernel_href}"' in page
    assert (report.page_path.parent / relu.kernel_href).read_text() == RELU_BEST
    assert next(p for p in report.problems if p.problem_id == "2_gemm_add").kernel_href is None
    assert len(report.kernel_paths) == 5


def test_first_run_says_there_is_no_comparison_in_one_line(two_runs, tmp_path):
    report = write_html_report(two_runs, tmp_path / "first.html", run_id="run-a")
    assert report.compared_with is None and "no finished run before run-a" in report.comparison_note
    line = next(line for line in report.page_path.read_text().splitlines() if "No comparison:" in line)
    assert str(markupsafe.escape(report.comparison_note)) in line


def test_values_are_escaped_and_odd_ids_get_safe_file_names(tmp_path):
    write_run(tmp_path, "run-x", [correct("L1/<b>relu</b>&x", 1, 1.5)], hours=0)
    report = write_html_report(tmp_path, tmp_path / "r.html")
    page = report.page_path.read_text()
    assert "<b>relu" not in page and "L1/&lt;b&gt;relu&lt;/b&gt;&amp;x" in page
    assert [p.name for p in report.kernel_paths] == ["L1_b_relu_b_x.py"]


def test_unknown_run_and_missing_matplotlib_are_one_line_errors(two_runs, tmp_path, monkeypatch):
    with pytest.raises(ReportError, match="no attempts of run 'nope'") as error:
        write_html_report(two_runs, tmp_path / "r.html", run_id="nope")
    assert "\n" not in str(error.value)
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # what `import` sees when the package is absent
    with pytest.raises(ReportError) as error:
        write_html_report(two_runs, tmp_path / "r.html")
    assert str(error.value) == "kforge report --html needs matplotlib: pip install 'kforge[report]'"
    assert not (tmp_path / "r.html").exists()


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    pytest.skip("needs headless Chromium (Debian package chromium)")


def _headless(browser: str, profile: Path, *arguments: str) -> subprocess.CompletedProcess:
    # Its own profile folder: another Chromium on the machine holds the default one's lock.
    command = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)


def _visible_text(dom: str) -> str:
    body = re.sub(r"<(style|script)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def test_rendered_page_shows_the_numbers(report, tmp_path):
    browser = _chromium()
    url = report.page_path.resolve().as_uri()
    text = _visible_text(_headless(browser, tmp_path / "profile", "--dump-dom", url).stdout)
    level_1 = group_label((1, "triton", "gpt-x"))
    assert f"{level_1} 3 2 {report.summary[level_1]['fast_0']:.3f} {report.summary[level_1]['fast_1']:.3f}" in text
    assert "all problems 6 4 0.667 0.500" in text  # problems, correct, fast_0, fast_1
    assert "correct 4 5" in text  # outcome, problems, attempts
    assert "1_relu 1 3 correct 2.50x best kernel" in text
    assert "1_matmul 1 2 runtime_error (x) - last candidate" in text
    assert "new failure 1_matmul 1.50x" in text and "faster 1_relu 2.00x" in text
    assert "NVIDIA H200" in text and "2.5.1+cu124" in text
    screenshot = tmp_path / "report.png"
    _headless(browser, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1280,2400", url)
    assert screenshot.read_bytes().startswith(PNG_MAGIC)
    shutil.copyfile(screenshot, SCREENSHOT_COPY)  # for a person to look at
