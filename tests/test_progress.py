"""`kforge run`'s progress bar on a terminal (the plain lines are checked through the CLI in test_cli.py)."""

import io

from kforge.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_counts_problems_correct_ones_and_the_best_speedup_and_ends_its_line_at_the_last():
    screen = Terminal()
    progress = Progress(total=3, stream=screen, on_terminal=screen.isatty())

    progress.problem_done("1_relu", [{"outcome": "compile_error"}, {"outcome": "correct", "speedup_eager": 1.5}])
    progress.problem_done("1_gelu", [{"outcome": "numerical_mismatch"}])
    assert screen.getvalue().count("\r") == 2 and "\n" not in screen.getvalue()
    last = screen.getvalue().rsplit("\r", 1)[1]
    assert last.startswith("[" + "#" * 16 + "." * 8 + "] 2/3 problems, 1 correct, best 1.50x")
    assert "elapsed, ~" in last and "left" in last

    progress.problem_done("2_linear_relu", [{"outcome": "correct", "speedup_eager": float("nan")}])
    last = screen.getvalue().rsplit("\r", 1)[1]
    assert last.startswith("[" + "#" * 24 + "] 3/3 problems, 2 correct, best 1.50x") and last.endswith("elapsed\n")
