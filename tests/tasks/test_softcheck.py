"""The LLM soft check over a local OpenAI-compatible server: the verdict it records beside the outcome,
and what it makes of replies without one."""

import json
from pathlib import Path

import pytest
from llm_server import scripted_openai_server

from kforge.config import ModelSettings
from tasks.llm import EndpointUnavailable
from tasks.problems import parse_problem
from tasks.softcheck import needs_model_notice, soft_check_kernel, wants_soft_check, with_soft_check

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = parse_problem(ROOT / "data" / "problems" / "smoke" / "1_relu.py")
KERNEL = (ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()
CORRECT_ROW = {"outcome": "correct", "error_class": None, "cost_usd": 0.5}


def soft_check_config(config, server, tmp_path, **llm):
    settings = ModelSettings(model="scripted", base_url=server.base_url, api_key_env="KFORGE_TEST_NO_KEY", **llm)
    return config.model_copy(update={"agent": "llm", "soft_check": True, "llm": settings, "cache_dir": str(tmp_path)})


def test_a_pass_verdict_is_recorded_with_its_tokens_and_cost(config, tmp_path):
    verdict = {"verdict": "pass", "reason": "one OpenMP loop computes every element in C++"}
    reply = {"content": json.dumps(verdict), "usage": {"prompt_tokens": 900, "completion_tokens": 40}}
    with scripted_openai_server([reply]) as server:
        run_config = soft_check_config(config, server, tmp_path, usd_per_million_input_tokens=1000.0)
        soft_check = soft_check_kernel(PROBLEM, KERNEL, run_config)
    assert (soft_check.verdict, soft_check.reason, soft_check.error) == ("pass", verdict["reason"], None)
    assert (soft_check.tokens_in, soft_check.tokens_out) == (900, 40) and soft_check.cost_usd == pytest.approx(0.9)
    row = with_soft_check(CORRECT_ROW, soft_check)
    assert (row["soft_check"], row["soft_check_tokens_in"], row["soft_check_tokens_out"]) == ("pass", 900, 40)
    assert row["cost_usd"] == pytest.approx(0.5 + 0.9) and row["soft_check_error"] is None


def test_a_fail_verdict_keeps_its_reason_and_never_changes_the_outcome(config, tmp_path):
    reason = "forward calls torch.relu on the input; the C++ function is never called"
    reply = f'Looking at forward:\n```json\n{{"verdict": "FAIL", "reason": "{reason}"}}\n```\n'
    with scripted_openai_server([{"content": reply}]) as server:
        soft_check = soft_check_kernel(PROBLEM, KERNEL, soft_check_config(config, server, tmp_path))
    row = with_soft_check(CORRECT_ROW, soft_check)
    assert (row["soft_check"], row["soft_check_reason"], row["soft_check_error"]) == ("fail", reason, None)
    assert (row["outcome"], row["error_class"]) == ("correct", None)


@pytest.mark.parametrize(
    "reply",
    [
        "The kernel looks fine to me.",  # prose, no JSON
        '{"verdict": "probably", "reason": "hard to say"}',  # no verdict among pass | fail
        '{"verdict": "pass", "reason": "every ele',  # cut off
    ],
)
def test_a_reply_without_a_verdict_is_recorded_as_the_soft_check_error(config, tmp_path, reply):
    with scripted_openai_server([{"content": reply}]) as server:
        soft_check = soft_check_kernel(PROBLEM, KERNEL, soft_check_config(config, server, tmp_path))
    row = with_soft_check(CORRECT_ROW, soft_check)
    assert row["soft_check"] is None and row["soft_check_reason"] is None
    assert row["soft_check_error"] == 'the soft-check reply has no JSON object with "verdict": "pass" or "fail"'
    assert row["soft_check_tokens_in"] > 0 and row["outcome"] == "correct"


def test_a_refused_request_is_an_error_and_an_unavailable_endpoint_is_retried(config, tmp_path):
    with scripted_openai_server([{"status": 401}, {"status": 503}]) as server:
        run_config = soft_check_config(config, server, tmp_path, reply_cache=False)
        refused = soft_check_kernel(PROBLEM, KERNEL, run_config)
        with pytest.raises(EndpointUnavailable, match="HTTP 503"):  # the Prefect task retries it
            soft_check_kernel(PROBLEM, KERNEL, run_config)
    assert refused.verdict is None and "HTTP 401" in refused.error and server.base_url in refused.error


def test_the_prompt_holds_the_problem_and_the_candidate_and_asks_for_a_json_verdict(config, tmp_path):
    with scripted_openai_server([{"content": '{"verdict": "pass", "reason": "ok"}'}] * 2) as server:
        run_config = soft_check_config(config, server, tmp_path, reply_cache=False)
        soft_check_kernel(PROBLEM, KERNEL, run_config)
        soft_check_kernel(PROBLEM, KERNEL, run_config.model_copy(update={"allow_library_calls": True}))
    strict, lenient = [request["body"]["messages"] for request in server.requests if request["body"]]
    user_prompt = strict[-1]["content"]
    assert PROBLEM.source.strip() in user_prompt and KERNEL.strip() in user_prompt
    assert "problem_id: 1_relu\n" in user_prompt and '{"verdict": "pass" or "fail", "reason": ' in user_prompt
    assert "native cpu kernel code only" in strict[0]["content"]
    assert "This run allows calls to PyTorch" in lenient[0]["content"]


def test_without_a_model_nothing_runs_and_the_run_is_told_once(config):
    reference = config.model_copy(update={"agent": "reference", "soft_check": True})
    assert not wants_soft_check(reference, CORRECT_ROW)
    notices = [needs_model_notice(reference, "run-a") for _ in range(3)] + [needs_model_notice(reference, "run-b")]
    assert notices[0] and "needs a model" in notices[0] and notices[1:3] == [None, None] and notices[3]
    assert needs_model_notice(config, "run-c") is None  # soft check off: nothing to say
    llm = config.model_copy(update={"agent": "llm", "soft_check": True})
    assert wants_soft_check(llm, CORRECT_ROW) and not wants_soft_check(llm, {"outcome": "numerical_mismatch"})
    assert not wants_soft_check(llm.model_copy(update={"soft_check": False}), CORRECT_ROW)
