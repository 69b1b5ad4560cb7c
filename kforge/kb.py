"""`kforge kb show|diff|export|import`: the knowledge base for people, and for carrying it between GPUs.

The functions return text or paths and raise KbFormatError (one line naming the file); `kb_app` is the
typer sub-app that prints them, registered in kforge/cli.py with `app.add_typer(kb_app, name="kb")`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tasks.knowledge import (
    DEFAULT_KB_DIR,
    SEED_PATH,
    KbFormatError,
    KnowledgeBase,
    diff,
    load,
    load_latest,
    save_version,
    to_document,
    versions,
)


def resolve(path: str | Path | None, kb_dir: str | Path = DEFAULT_KB_DIR) -> KnowledgeBase:
    """A knowledge-base file; a directory means its newest version; None means the newest in `kb_dir`
    (the seed when nothing has been saved there)."""
    if path is None:
        return load_latest(kb_dir)
    path = Path(path)
    if path.is_dir():
        if not versions(path):
            raise KbFormatError(f"{path}: no kb-v<N>.json versions in this directory")
        return load_latest(path)
    return load(path)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def show(kb: KnowledgeBase) -> str:
    """A table: state, technique, expected gain, attempts, successes, mean and spread of measured gain, GPUs."""
    header = ("state", "technique", "expected", "attempts", "successes", "mean", "spread", "gpus")
    rows = [
        (
            s.name,
            o.technique,
            _cell(o.expected_gain),
            str(o.attempts),
            str(o.successes),
            _cell(o.mean_gain),
            _cell(o.gain_spread),
            ",".join(o.gpus) or "-",
        )
        for s in kb.states
        for o in s.optimizations
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    return f"knowledge base version {kb.kb_version}\n" + "\n".join(lines)


def diff_files(a: str | Path, b: str | Path) -> str:
    return diff(resolve(a), resolve(b))


def export(path: str | Path | None, out: str | Path) -> Path:
    """Write the (validated) knowledge base at `path` to the file `out`, to carry it to another host."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(to_document(resolve(path)), indent=2) + "\n")
    return out


def import_file(file: str | Path, kb_dir: str | Path = DEFAULT_KB_DIR) -> Path:
    """Validate `file` and save it in `kb_dir` as the next version (after the newest there and after its
    own), so the imported knowledge is what the next run loads. Returns the new version's path."""
    kb = load(file)
    saved = versions(kb_dir)
    newest = saved[-1] if saved else load(SEED_PATH).kb_version
    imported = KnowledgeBase(max(newest + 1, kb.kb_version), kb.states, f"imported from {Path(file).name}")
    return save_version(imported, kb_dir)


kb_app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
KbDirOption = Annotated[Path, typer.Option("--kb-dir", help="Directory of the saved versions (kb-v<N>.json).")]


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@kb_app.command("show")
def show_command(
    path: Annotated[Path | None, typer.Argument(help="A version file or directory; default: the newest.")] = None,
    kb_dir: KbDirOption = DEFAULT_KB_DIR,
) -> None:
    """Print the states and techniques with expected and measured gains."""
    try:
        typer.echo(show(resolve(path, kb_dir)))
    except KbFormatError as exc:
        _fail(str(exc))


@kb_app.command("diff")
def diff_command(
    a: Annotated[Path, typer.Argument(help="The older knowledge base (file or directory).")],
    b: Annotated[Path, typer.Argument(help="The newer knowledge base (file or directory).")],
) -> None:
    """What changed from A to B: states and techniques added, gains changed, descriptions rewritten."""
    try:
        typer.echo(diff_files(a, b))
    except KbFormatError as exc:
        _fail(str(exc))


@kb_app.command("export")
def export_command(
    path: Annotated[Path, typer.Argument(help="The knowledge base to export (file or directory).")],
    out: Annotated[Path, typer.Argument(help="The JSON file to write.")],
) -> None:
    """Write a knowledge base to one JSON file, to carry it to another GPU host."""
    try:
        typer.echo(f"wrote {export(path, out)}")
    except KbFormatError as exc:
        _fail(str(exc))


@kb_app.command("import")
def import_command(
    file: Annotated[Path, typer.Argument(help="A knowledge-base JSON file (from kforge kb export).")],
    kb_dir: KbDirOption = DEFAULT_KB_DIR,
) -> None:
    """Validate FILE and save it as the next version in --kb-dir, where the next run finds it."""
    try:
        typer.echo(f"imported {file} as {import_file(file, kb_dir)}")
    except KbFormatError as exc:
        _fail(str(exc))
