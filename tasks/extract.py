"""Pull the candidate source (a Python file defining `class ModelNew`) out of a model's reply."""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
OPENING_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*)$")
DEFINES_MODEL_NEW = re.compile(r"^\s*class\s+ModelNew\b", re.MULTILINE)


@dataclass(frozen=True)
class CodeBlock:
    language: str  # lower-cased first word of the info string; "" when untagged
    code: str
    closed: bool  # False when the reply ended before the closing fence


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= len(fence) and stripped == fence[0] * len(stripped)


def fenced_blocks(text: str) -> list[CodeBlock]:
    """The ``` and ~~~ fenced blocks of a markdown text, in order, de-indented to their fence."""
    blocks: list[CodeBlock] = []
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        opening = OPENING_FENCE.match(lines[index])
        index += 1
        # A backtick fence's info string has no backticks: "```x = 1```" is inline code, not a fence.
        if not opening or (opening["fence"][0] == "`" and "`" in opening["info"]):
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        while index < len(lines) and not _closes(lines[index], fence):
            line = lines[index]
            body.append(line[min(indent, len(line) - len(line.lstrip())) :])
            index += 1
        closed = index < len(lines)
        index += 1
        language = re.match(r"[\w+#.-]*", opening["info"].strip())[0].lower()
        blocks.append(CodeBlock(language, textwrap.dedent("\n".join(body)).strip("\n") + "\n", closed))
    return blocks


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _defines_model_new(code: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        # The compile stage reports the syntax error to the agent, so the block still counts.
        return DEFINES_MODEL_NEW.search(code) is not None
    return any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body)


def _is_candidate(block: CodeBlock) -> bool:
    if block.language in PYTHON_TAGS:
        return _defines_model_new(block.code)
    # A block tagged cpp or cuda counts only if it is in fact Python (a mislabelled fence).
    return _parses(block.code) and _defines_model_new(block.code)


def extract_candidate(reply_text: str, finish_reason: str | None = None) -> tuple[str | None, str | None]:
    """Return `(candidate_source, None)` from a model reply, or `(None, reason)` with a one-line reason.

    `reply_text` is the assistant message as received; `finish_reason` is the API's ("stop",
    "length", ...), used to explain truncation. When several blocks define ModelNew the last one is
    taken, since models restate a corrected version at the end. A complete block with a syntax error
    is returned as is; a block cut off by the end of the reply is returned only if it parses.
    """
    text = reply_text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").rstrip()
    text = re.sub(r"\A\s*\n", "", text)  # leading blank lines, but not the first line's indent
    if not text:
        return None, "empty reply"
    # An unclosed fence at the end usually means the token limit; say so only when the API did.
    cut_off = "the reply was cut off (finish_reason=length)" if finish_reason == "length" else "the reply ends"

    blocks = fenced_blocks(text)
    if not blocks:
        # A reply that is only code, without fences.
        source = textwrap.dedent(text) + "\n"
        if _parses(source) and _defines_model_new(source):
            return source, None
        if finish_reason == "length" and DEFINES_MODEL_NEW.search(text):
            return None, "the reply was cut off (finish_reason=length) before the code was complete"
        return None, "the reply has no code block"

    candidates = [block for block in blocks if _is_candidate(block)]
    if not candidates:
        if not blocks[-1].closed:
            return None, f"{cut_off} inside an unclosed code block, before any class ModelNew"
        return None, "no code block defines class ModelNew"
    chosen = candidates[-1]
    if not chosen.closed and not _parses(chosen.code):
        return None, f"{cut_off} inside the unclosed code block that defines class ModelNew, which does not parse"
    return chosen.code, None
