"""Model access through the real openai/LangChain clients against a local OpenAI-compatible server."""

import pytest
from llm_server import scripted_openai_server

from kforge.config import ModelSettings
from tasks.llm import EndpointError, EndpointUnavailable, chat, check_endpoint, cost_usd

MESSAGES = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "problem_id: 1_relu"}]


def settings_for(server, **overrides) -> ModelSettings:
    return ModelSettings(model="scripted", base_url=server.base_url, api_key_env="KFORGE_TEST_NO_KEY", **overrides)


def chat_requests(server) -> list[dict]:
    return [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]


def test_reply_tokens_and_the_request_as_sent(tmp_path):
    script = [{"content": "hello", "usage": {"prompt_tokens": 321, "completion_tokens": 45}}]
    with scripted_openai_server(script) as server:
        reply = chat(settings_for(server, temperature=0.5, max_tokens=777), MESSAGES, tmp_path)
    assert (reply.text, reply.finish_reason, reply.tokens_in, reply.tokens_out, reply.cached) == (
        "hello",
        "stop",
        321,
        45,
        False,
    )
    [sent] = chat_requests(server)
    assert sent["model"] == "scripted" and sent["temperature"] == 0.5
    assert 777 in (sent.get("max_tokens"), sent.get("max_completion_tokens"))
    assert [m["content"] for m in sent["messages"]] == [m["content"] for m in MESSAGES]


def test_a_repeated_call_is_answered_from_the_reply_cache_unless_bypassed(tmp_path):
    script = [{"content": "first"}, {"content": "second"}, {"content": "third"}]
    with scripted_openai_server(script) as server:
        first = chat(settings_for(server), MESSAGES, tmp_path)
        again = chat(settings_for(server), MESSAGES, tmp_path)
        assert len(chat_requests(server)) == 1
        assert (again.text, again.cached, again.tokens_in) == ("first", True, first.tokens_in)
        bypassed = chat(settings_for(server, reply_cache=False), MESSAGES, tmp_path)
        assert (bypassed.text, bypassed.cached) == ("second", False)
        other_temperature = chat(settings_for(server, temperature=0.9), MESSAGES, tmp_path)
        assert (other_temperature.text, other_temperature.cached) == ("third", False)  # another key


def test_server_errors_and_timeouts_are_retryable_and_name_the_url(tmp_path):
    with scripted_openai_server([{"status": 503}, {"status": 429}, {"hang_s": 10}]) as server:
        for expected in ("HTTP 503", "HTTP 429", "did not answer within 1 s"):
            with pytest.raises(EndpointUnavailable) as caught:
                chat(settings_for(server, timeout_s=1), MESSAGES, tmp_path)
            assert expected in str(caught.value) and server.base_url in str(caught.value)


def test_a_refused_key_or_unknown_model_is_not_retryable(tmp_path):
    with scripted_openai_server([{"status": 401}, {"status": 404}]) as server:
        for status in (401, 404):
            with pytest.raises(EndpointError, match=f"HTTP {status}"):
                chat(settings_for(server), MESSAGES, tmp_path)


def test_a_dead_endpoint_fails_the_preflight_check_with_its_url(unused_port):
    dead = ModelSettings(model="m", base_url=f"http://127.0.0.1:{unused_port}/v1")
    with pytest.raises(EndpointUnavailable, match=f"127.0.0.1:{unused_port}/v1 unreachable"):
        check_endpoint(dead, timeout_s=2)


def test_preflight_passes_a_live_endpoint_and_needs_a_key_for_openai_itself(monkeypatch):
    with scripted_openai_server([]) as server:
        check_endpoint(settings_for(server))
    monkeypatch.delenv("KFORGE_TEST_NO_KEY", raising=False)
    with pytest.raises(EndpointError, match="no API key: set KFORGE_TEST_NO_KEY"):
        check_endpoint(ModelSettings(model="gpt-x", api_key_env="KFORGE_TEST_NO_KEY"))


def test_cost_follows_the_configured_prices():
    priced = ModelSettings(model="m", usd_per_million_input_tokens=2.0, usd_per_million_output_tokens=8.0)
    assert cost_usd(priced, 1_000_000, 500_000) == pytest.approx(6.0)
    assert cost_usd(ModelSettings(model="m"), 10**6, 10**6) == 0.0
