"""Content-hash cache keys and the retry rule shared by the evaluation stages.

A stage's key is the hash of its real inputs (problem source, candidate source, backend,
toolchain, the settings that change its result), so a rerun of a failed flow run replays
finished stages from Prefect's result store and redoes only what failed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from tasks.harness.cpu import toolchain_version
from tasks.isolate import InfrastructureError


@functools.lru_cache(maxsize=1)
def toolchain_fingerprint() -> str:
    return f"torch {metadata.version('torch')}; {toolchain_version()}"


def content_key(stage: str, *parts: Any) -> str:
    """`stage-<sha256>` of the JSON of `parts` plus the toolchain."""
    payload = json.dumps([stage, toolchain_fingerprint(), *parts], sort_keys=True, default=str)
    return f"{stage}-{hashlib.sha256(payload.encode()).hexdigest()}"


@functools.lru_cache(maxsize=8)
def file_digest(path: Path) -> str:
    """Hash of a rules file whose content decides a stage's result (a changed rule is a new key)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def retry_when(transient: type[Exception]) -> Callable[[Any, Any, Any], bool]:
    """A Prefect retry condition: retry a task run only when it failed with `transient`."""

    def should_retry(_task: Any, _task_run: Any, state: Any) -> bool:
        try:
            state.result()
        except transient:
            return True
        except Exception:
            return False
        return False

    return should_retry


# Retry a stage only when the infrastructure failed, never for the candidate's own outcome.
retry_on_infrastructure = retry_when(InfrastructureError)
