"""Agent G's reply parsing: exactly one recommendation in a structured form, or a reason; and the distilled
profile it is sent, as text and as a chart, through a local OpenAI-compatible server."""

import base64
import json
from pathlib import Path

import pytest
from llm_server import scripted_openai_server

from kforge.config import ModelSettings
from tasks import distill
from tasks.analyze import analyze_kernel, parse_recommendation, profile_for_analysis
from tasks.ncu import parse_details
from tasks.problems import parse_problem

ROOT = Path(__file__).resolve().parents[2]

ADVICE = {"bottleneck": "latency bound", "recommendation": "fuse the two loops", "expected_effect": "1.2x"}


@pytest.mark.parametrize(
    "reply",
    [
        json.dumps(ADVICE),
        f"Here is my analysis.\n```json\n{json.dumps(ADVICE, indent=2)}\n```\nGood luck.",
        f"The kernel reads memory twice. {json.dumps(ADVICE)} That is all.",
    ],
)
def test_the_recommendation_is_found_in_json_prose_or_a_fence(reply):
    assert parse_recommendation(reply) == (ADVICE, None)


@pytest.mark.parametrize(
    "reply",
    [
        "Use shared memory.",
        json.dumps({"bottleneck": "x", "recommendation": "y"}),  # a key missing
        json.dumps({**ADVICE, "recommendation": ""}),  # an empty answer
        '{"bottleneck": "x", "recommendation": ',  # cut off
    ],
)
def test_a_reply_without_a_complete_recommendation_gives_the_reason(reply):
    recommendation, reason = parse_recommendation(reply)
    assert recommendation is None and "no JSON object with bottleneck, recommendation, expected_effect" in reason


@pytest.mark.parametrize("profile_format", ["text", "image", "both"])
def test_the_profile_reaches_the_model_as_text_an_image_or_both(config, tmp_path, profile_format):
    rows, _ = parse_details((ROOT / "tests" / "data" / "ncu_details_h200.csv").read_text(), 20)
    distilled = distill.distil({"runtime_ms": 0.1}, [{**r, "tool": "ncu"} for r in rows])
    problem = parse_problem(ROOT / "data" / "problems" / "smoke" / "1_relu.py")
    kernel = (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()
    timings = {"runtime_ms": 0.1, "runtime_p10_ms": 0.1, "runtime_p90_ms": 0.1, "eager_ms": 0.2, "speedup_eager": 2.0}
    with scripted_openai_server([{"content": json.dumps(ADVICE)}]) as server:
        settings = ModelSettings(model="scripted", base_url=server.base_url, api_key_env="KFORGE_TEST_NO_KEY")
        run_config = config.model_copy(update={"agent": "llm", "llm": settings, "cache_dir": str(tmp_path)})
        profile = profile_for_analysis(distilled, profile_format)
        analysis = analyze_kernel(problem, kernel, timings, run_config, profile)
    assert analysis.recommendation == ADVICE
    [request] = [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]
    content = request["messages"][1]["content"]
    parts = [content] if isinstance(content, str) else content
    texts = [p if isinstance(p, str) else p.get("text", "") for p in parts]
    images = [p["image_url"]["url"] for p in parts if isinstance(p, dict) and p.get("type") == "image_url"]
    assert ("4 launches" in "".join(texts)) == (profile_format != "image")
    assert ("attached chart" in "".join(texts)) == (profile_format != "text")
    assert len(images) == (profile_format != "text")
    if images:
        prefix = "data:image/png;base64,"
        assert images[0].startswith(prefix)
        assert base64.b64decode(images[0].removeprefix(prefix)) == distill.png_bytes(distilled)
