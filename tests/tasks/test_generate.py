"""Agent F over a local OpenAI-compatible server: what it records, and what it makes of odd replies."""

from pathlib import Path

from llm_server import scripted_openai_server

from kforge.config import ModelSettings
from tasks.generate import GenerationRequest, make_llm_generator
from tasks.problems import parse_problem

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = parse_problem(ROOT / "data" / "problems" / "smoke" / "1_relu.py")
KERNEL = (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()


def generator_for(server, cache_dir, **llm):
    settings = ModelSettings(model="scripted", base_url=server.base_url, api_key_env="KFORGE_TEST_NO_KEY", **llm)
    return make_llm_generator(settings, str(cache_dir))


def test_a_cross_platform_reference_is_shown_and_recorded(tmp_path):
    with scripted_openai_server([{"content": f"```python\n{KERNEL}```"}] * 2) as server:
        generate = generator_for(server, tmp_path, usd_per_million_input_tokens=1.0, reply_cache=False)
        with_reference = generate(GenerationRequest(PROBLEM, "cuda", 0, reference_backend="cpu"))
        without = generate(GenerationRequest(PROBLEM, "cuda", 0))
    assert with_reference.candidate_source == KERNEL
    assert with_reference.agent_config["reference_backend"] == "cpu"
    assert with_reference.agent_config["reference_shown"] is True
    assert without.agent_config["reference_shown"] is False
    assert with_reference.prompt_hash != without.prompt_hash
    assert with_reference.cost_usd == with_reference.tokens_in / 1e6 > 0
    first_prompt = server.requests[0]["body"]["messages"][-1]["content"]
    assert (
        KERNEL.strip() in first_prompt and KERNEL.strip() not in server.requests[1]["body"]["messages"][-1]["content"]
    )


def test_a_truncated_reply_is_a_generation_failure_with_the_reason(tmp_path):
    cut = {"content": f"```python\n{KERNEL[: len(KERNEL) // 2]}", "finish_reason": "length"}
    with scripted_openai_server([cut]) as server:
        reply = generator_for(server, tmp_path)(GenerationRequest(PROBLEM, "cpu", 0))
    assert reply.candidate_source is None and reply.error_class == "no_code"
    assert "cut off (finish_reason=length)" in reply.error and reply.agent_config["finish_reason"] == "length"


def test_a_refused_key_stops_the_problem_without_retrying(tmp_path):
    with scripted_openai_server([{"status": 401}]) as server:
        reply = generator_for(server, tmp_path)(GenerationRequest(PROBLEM, "cpu", 0))
    assert (reply.candidate_source, reply.error_class, reply.exhausted) == (None, "endpoint_error", True)
    assert "HTTP 401" in reply.error and server.base_url in reply.error
