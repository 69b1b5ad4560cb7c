"""Problem suites: any directory of KernelBench-format files (`Model`, `get_inputs`, `get_init_inputs`).

Files are checked statically (parsed, never executed here) so a malformed file costs a one-line
report, not a run. A file that parses but fails when run is caught later by the isolated worker.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
LEVEL_DIR = re.compile(r"level_?(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class Problem:
    problem_id: str  # file stem, e.g. "1_relu" or KernelBench's "19_ReLU"
    suite: str  # directory name, e.g. "smoke" or "level1"
    level: int | None
    path: str
    source: str

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RejectedFile:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _module_level_int(tree: ast.Module, name: str) -> int | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
                return node.value.value
    return None


def _defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def parse_problem(path: Path, suite: str | None = None) -> Problem:
    """Read and check one problem file. Raises ValueError with a one-line reason if it is malformed."""
    try:
        source = path.read_text()
    except UnicodeDecodeError:
        raise ValueError("not a UTF-8 text file") from None
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise ValueError(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    missing = [name for name in REQUIRED_NAMES if name not in _defined_names(tree)]
    if missing:
        raise ValueError(
            f"missing {', '.join(missing)} (a KernelBench problem defines Model, get_inputs, get_init_inputs)"
        )
    level = _module_level_int(tree, "LEVEL")
    if level is None:
        match = LEVEL_DIR.search(path.parent.name)
        level = int(match.group(1)) if match else None
    return Problem(
        problem_id=path.stem,
        suite=suite or path.parent.name,
        level=level,
        path=str(path),
        source=source,
    )


def load_suite(directory: str | Path) -> tuple[list[Problem], list[RejectedFile]]:
    """All problems in `directory` (not recursive, `*.py`, sorted by KernelBench number then name),
    and the files rejected with their reasons. Raises FileNotFoundError if the directory is absent."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"problem suite {root} is not a directory")
    problems, rejected = [], []
    for path in sorted(root.glob("*.py"), key=_problem_sort_key):
        if path.name.startswith("_"):
            continue
        try:
            problems.append(parse_problem(path, suite=root.name))
        except (ValueError, OSError) as exc:
            rejected.append(RejectedFile(str(path), str(exc)))
    return problems, rejected


def _problem_sort_key(path: Path) -> tuple[int, str]:
    number = re.match(r"(\d+)_", path.name)
    return (int(number.group(1)) if number else 1 << 30, path.name)
