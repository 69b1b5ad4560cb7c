"""The scripted chat server, driven by the real `openai` client and by langchain's ChatOpenAI."""

import contextlib
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
from langchain_openai import ChatOpenAI
from llm_server import scripted_openai_server

USER = [{"role": "user", "content": "x" * 40}]


def client(server, timeout: float = 10.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0, timeout=timeout)


def chat_model(server, timeout: float = 10.0) -> ChatOpenAI:
    return ChatOpenAI(model="scripted-model", base_url=server.base_url, api_key="test", max_retries=0, timeout=timeout)


def test_content_usage_and_model_come_back_and_requests_are_recorded():
    usage = {"prompt_tokens": 120, "completion_tokens": 30}
    with scripted_openai_server([{"content": "first", "usage": usage}, {"content": "y" * 21}]) as server:
        first = client(server).chat.completions.create(model="model-a", messages=USER)
        second = client(server).chat.completions.create(model="model-b", messages=USER)

    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-")
    assert first.model == "model-a" and second.model == "model-b"
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].message.content == "first"
    assert first.choices[0].finish_reason == "stop"
    assert (first.usage.prompt_tokens, first.usage.completion_tokens, first.usage.total_tokens) == (120, 30, 150)
    # Default usage: 4 characters a token.
    assert (second.usage.prompt_tokens, second.usage.completion_tokens, second.usage.total_tokens) == (10, 5, 15)
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions"] * 2
    assert server.requests[1]["body"]["model"] == "model-b"
    assert server.requests[1]["body"]["messages"] == USER


def test_error_statuses_raise_the_matching_openai_errors():
    script = [{"status": 500}, {"status": 429}, {"status": 401, "message": "bad key"}, {"status": 503}]
    with scripted_openai_server(script) as server:
        with pytest.raises(openai.InternalServerError):
            client(server).chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.RateLimitError) as rate_limited:
            client(server).chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.AuthenticationError, match="bad key"):
            client(server).chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.InternalServerError) as unavailable:
            client(server).chat.completions.create(model="m", messages=USER)

    assert rate_limited.value.status_code == 429
    assert rate_limited.value.code == "rate_limit_exceeded"
    assert unavailable.value.status_code == 503


def test_a_request_past_the_end_of_the_script_gets_500_saying_so():
    with scripted_openai_server([{"content": "only one"}]) as server:
        client(server).chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.InternalServerError, match="exhausted"):
            client(server).chat.completions.create(model="m", messages=USER)


def test_a_hang_past_the_client_timeout_raises_and_shutdown_does_not_wait_for_it():
    with scripted_openai_server([{"hang_s": 30}]) as server:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            client(server, timeout=1.0).chat.completions.create(model="m", messages=USER)
        closing = time.monotonic()
    assert closing - started < 5
    assert time.monotonic() - closing < 1


def test_a_hanging_request_does_not_block_others():
    def respond(request_json):
        return {"hang_s": 30} if request_json["model"] == "slow" else {"content": "quick"}

    def ask_slowly():
        # Shutdown closes the hanging request's connection; any error ends this thread.
        with contextlib.suppress(openai.APIError):
            client(server, timeout=30).chat.completions.create(model="slow", messages=USER)

    with scripted_openai_server(respond) as server:
        slow = threading.Thread(target=ask_slowly, daemon=True)
        slow.start()
        time.sleep(0.1)
        started = time.monotonic()
        reply = client(server).chat.completions.create(model="fast", messages=USER)
        assert time.monotonic() - started < 1
    slow.join(timeout=2)
    assert not slow.is_alive(), "the hanging request outlived the server"
    assert reply.choices[0].message.content == "quick"


def test_responder_sees_the_request_and_models_are_listed():
    with scripted_openai_server(lambda request: {"content": request["messages"][-1]["content"].upper()}) as server:
        reply = client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "echo"}])
        models = client(server).models.list()
    assert reply.choices[0].message.content == "ECHO"
    assert [m.id for m in models.data] == ["scripted"]
    assert server.requests[-1] == {"path": "/v1/models", "body": None}


def test_chat_openai_exposes_usage_and_finish_reason():
    script = [
        {"content": "done", "usage": {"prompt_tokens": 11, "completion_tokens": 7}},
        {"content": "cut off mid", "finish_reason": "length"},
    ]
    with scripted_openai_server(script) as server:
        done = chat_model(server).invoke("hello")
        cut = chat_model(server).invoke("hello")

    assert done.content == "done"
    assert done.usage_metadata["input_tokens"] == 11
    assert done.usage_metadata["output_tokens"] == 7
    assert done.usage_metadata["total_tokens"] == 18
    assert done.response_metadata["finish_reason"] == "stop"
    assert done.response_metadata["model_name"] == "scripted-model"
    assert done.response_metadata["token_usage"]["prompt_tokens"] == 11
    assert done.response_metadata["token_usage"]["completion_tokens"] == 7
    assert cut.response_metadata["finish_reason"] == "length"


def test_chat_openai_errors_are_openai_errors():
    with scripted_openai_server([{"status": 500}, {"hang_s": 30}]) as server:
        with pytest.raises(openai.InternalServerError):
            chat_model(server).invoke("hello")
        with pytest.raises(openai.APITimeoutError):
            chat_model(server, timeout=1.0).invoke("hello")


def test_cli_answers_with_the_file_named_by_the_problem_id(tmp_path: Path):
    (tmp_path / "1_relu.py").write_text("class ModelNew:\n    pass\n")
    command = [sys.executable, str(Path(__file__).with_name("llm_server.py")), "--port", "0", "--reply-dir", tmp_path]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        base_url = re.search(r"http://\S+/v1", process.stdout.readline()).group(0)
        cli = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0, timeout=10)

        def ask(prompt: str) -> str:
            messages = [{"role": "system", "content": "Write kernels."}, {"role": "user", "content": prompt}]
            return cli.chat.completions.create(model="m", messages=messages).choices[0].message.content

        found = ask("Make this fast.\nproblem_id: 1_relu\nsuite: level1")
        missing = ask("problem_id: 2_gelu")
        unmarked = ask("Make this fast.")
    finally:
        process.terminate()
        process.wait(timeout=5)

    prose, fenced = found.split("\n", 1)
    assert "1_relu" in prose
    assert fenced.strip() == "```python\nclass ModelNew:\n    pass\n```"
    assert "2_gelu" in missing and "```" not in missing
    assert "problem_id" in unmarked and "```" not in unmarked
