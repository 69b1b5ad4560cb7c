"""Analysis stage (agent G): one optimization recommendation for a correct kernel.

G reads the kernel, its timings against the baselines and, when the kernel was profiled, the distilled
profile (tasks/distill.py) as text, as a PNG chart for multimodal models, or both (`profile_for_analysis`),
and answers with one JSON object {bottleneck, recommendation, expected_effect}. The recommendation
conditions agent F's next refinement.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from prefect import task

from kforge.config import RunConfig
from tasks import distill
from tasks.generate import retry_on_endpoint
from tasks.llm import EndpointError, chat, cost_usd
from tasks.problems import Problem
from tasks.prompts import prompt_hash, render_messages, templates_digest

RECOMMENDATION_KEYS = ("bottleneck", "recommendation", "expected_effect")
TIMING_KEYS = (
    "runtime_ms",
    "runtime_p10_ms",
    "runtime_p90_ms",
    "eager_ms",
    "compile_ms",
    "speedup_eager",
    "speedup_compile",
)


@dataclass(frozen=True)
class Analysis:
    recommendation: dict[str, str] | None
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    prompt_hash: str | None = None


def parse_recommendation(reply_text: str) -> tuple[dict[str, str] | None, str | None]:
    """The {bottleneck, recommendation, expected_effect} object in a reply, or (None, why not)."""
    fenced = re.findall(r"```(?:json)?\s*\n(.*?)```", reply_text, flags=re.DOTALL)
    start, end = reply_text.find("{"), reply_text.rfind("}")
    candidates = [*fenced, reply_text[start : end + 1] if 0 <= start < end else ""]
    for text in candidates:
        try:
            parsed = json.loads(text)
        except ValueError:
            continue
        if isinstance(parsed, dict) and all(isinstance(parsed.get(k), str) and parsed[k] for k in RECOMMENDATION_KEYS):
            return {k: parsed[k].strip() for k in RECOMMENDATION_KEYS}, None
    return None, f"the analysis reply has no JSON object with {', '.join(RECOMMENDATION_KEYS)}"


@dataclass(frozen=True)
class ProfileForAnalysis:
    text: str | None  # the distilled summary ("text", "both")
    png: bytes | None  # its chart ("image", "both")


def profile_for_analysis(
    distilled: distill.Distilled | None, profile_format: Literal["text", "image", "both"]
) -> ProfileForAnalysis | None:
    """What G is shown of a distilled profile (None without one). Raises RuntimeError for "image" and
    "both" when matplotlib is not installed."""
    if distilled is None or not distilled.tool:
        return None
    text = distill.summary_text(distilled) if profile_format in ("text", "both") else None
    png = distill.png_bytes(distilled) if profile_format in ("image", "both") else None
    return ProfileForAnalysis(text, png)


def analysis_messages(
    problem: Problem,
    kernel_source: str,
    backend: str,
    timings: dict[str, Any],
    profile: str | None,
    profile_png: bytes | None = None,
) -> list[dict[str, Any]]:
    """G's messages; with `profile_png` the user message's content is a list of a text part and the chart
    as an OpenAI-style image_url part (a base64 data URL)."""
    messages = render_messages(
        "analyze",
        problem_id=problem.problem_id,
        problem_source=problem.source,
        backend=backend,
        kernel_source=kernel_source,
        timings={key: timings.get(key) for key in TIMING_KEYS},
        profile=profile,
        profile_image=profile_png is not None,
    )
    if profile_png is None:
        return messages
    system, user = messages
    url = "data:image/png;base64," + base64.b64encode(profile_png).decode()
    parts = [{"type": "text", "text": user["content"]}, {"type": "image_url", "image_url": {"url": url}}]
    return [system, {"role": "user", "content": parts}]


def analyze_kernel(
    problem: Problem,
    kernel_source: str,
    timings: dict[str, Any],
    config: RunConfig,
    profile: ProfileForAnalysis | None = None,
) -> Analysis:
    """Agent G's recommendation for a correct kernel, with what `profile_for_analysis` gave of its profile.
    Raises EndpointUnavailable (retryable); any other failure is an Analysis without a recommendation,
    with the reason."""
    text, png = (profile.text, profile.png) if profile else (None, None)
    messages = analysis_messages(problem, kernel_source, config.backend, timings, text, png)
    digest = prompt_hash(messages)
    try:
        reply = chat(config.llm, messages, config.cache_dir)
    except EndpointError as exc:
        return Analysis(None, error=str(exc), prompt_hash=digest)
    recommendation, error = parse_recommendation(reply.text)
    return Analysis(
        recommendation,
        error=error,
        tokens_in=reply.tokens_in,
        tokens_out=reply.tokens_out,
        cost_usd=0.0 if reply.cached else cost_usd(config.llm, reply.tokens_in, reply.tokens_out),
        prompt_hash=digest,
    )


def failed_analysis(error: BaseException | None) -> Analysis:
    """No recommendation: the endpoint stayed unavailable through every retry."""
    return Analysis(None, error=str(error) if error else "the analyze task failed")


def _analysis_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    config: RunConfig = parameters["config"]
    payload = [
        parameters["problem"].source_hash,
        parameters["kernel_source"],
        {key: parameters["timings"].get(key) for key in TIMING_KEYS},
        config.backend,
        config.llm.model_dump(include={"model", "temperature", "max_tokens"}),
        templates_digest(),
        parameters["run_id"],
    ]
    if profile := parameters.get("profile"):
        payload.append([profile.text, hashlib.sha256(profile.png).hexdigest() if profile.png else None])
    return "analyze-" + hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@task(name="analyze", cache_key_fn=_analysis_cache_key, persist_result=True, retry_condition_fn=retry_on_endpoint)
def analyze_task(
    problem: Problem,
    kernel_source: str,
    timings: dict[str, Any],
    config: RunConfig,
    run_id: str,
    profile: ProfileForAnalysis | None = None,
) -> Analysis:
    return analyze_kernel(problem, kernel_source, timings, config, profile)


def wants_analysis(config: RunConfig, row: dict[str, Any], iteration: int) -> bool:
    """G runs on a correct kernel when a model is configured and another iteration will use its advice."""
    return (
        config.performance_agent
        and config.agent == "llm"
        and row["outcome"] == "correct"
        and (iteration < config.iterations)
    )


def with_analysis(row: dict[str, Any], analysis: Analysis) -> dict[str, Any]:
    """The attempt row with G's recommendation, its tokens and its cost added."""
    return {
        **row,
        "recommendation": json.dumps(analysis.recommendation) if analysis.recommendation else None,
        "analysis_error": analysis.error,
        "analysis_tokens_in": analysis.tokens_in,
        "analysis_tokens_out": analysis.tokens_out,
        "cost_usd": (row.get("cost_usd") or 0.0) + analysis.cost_usd,
    }
