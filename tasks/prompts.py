"""Render the agents' prompts from `prompts/<role>.j2` into chat messages.

A role's template has a `system` and a `user` block; each becomes one message. Templates are rendered
with StrictUndefined, so a variable the caller forgot fails loudly instead of vanishing from the prompt.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import jinja2

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"


@functools.lru_cache(maxsize=4)
def _environment(prompts_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(prompts_dir),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )


def render_messages(role: str, prompts_dir: Path = PROMPTS_DIR, **variables: Any) -> list[dict[str, str]]:
    """[{"role": "system", ...}, {"role": "user", ...}] from `prompts/<role>.j2` and `variables`."""
    template = _environment(prompts_dir).get_template(f"{role}.j2")
    context = template.new_context(variables)
    return [
        {"role": block, "content": "".join(template.blocks[block](context)).strip() + "\n"}
        for block in ("system", "user")
    ]


def prompt_hash(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


def templates_digest(prompts_dir: Path = PROMPTS_DIR) -> list[str]:
    """Hashes of every template: a changed prompt is a new cache key for the agents' stages."""
    return sorted(hashlib.sha256(path.read_bytes()).hexdigest() for path in prompts_dir.glob("*.j2"))
