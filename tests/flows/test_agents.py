"""Agents F and G over the real openai/LangChain clients, talking HTTP to a local OpenAI-compatible server
whose replies are scripted per problem, through run-suite on a real ephemeral Prefect server."""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from llm_server import scripted_openai_server
from tests_flows_helpers import retry_flow_run

from flows.suite import run_suite
from kforge import results

ROOT = Path(__file__).resolve().parents[2]
SMOKE, KERNELS = ROOT / "data" / "problems" / "smoke", ROOT / "kernels_ref" / "cpu"
RECOMMENDATION = {
    "bottleneck": "memory bandwidth: one pass, no reuse",
    "recommendation": "vectorize the loop with float4 loads",
    "expected_effect": "about 1.5x",
}


def kernel_reply(name: str, **extra) -> dict:
    return {"content": f"Here is the kernel.\n\n```python\n{(KERNELS / name).read_text()}```\n", **extra}


class PerProblemScripts:
    """A responder: each request is answered by the next action scripted for the problem it names."""

    def __init__(self, scripts: dict[str, list[dict]]):
        self.scripts = scripts

    def __call__(self, body: dict) -> dict:
        problem_id = re.search(r"problem_id: (\S+)", body["messages"][-1]["content"]).group(1)
        queue = self.scripts.get(problem_id) or [{"status": 500, "message": f"nothing scripted for {problem_id}"}]
        return queue.pop(0)


def user_prompts(server, problem_id: str) -> list[str]:
    prompts = [r["body"]["messages"][-1]["content"] for r in server.requests if r["body"]]
    return [p for p in prompts if f"problem_id: {problem_id}\n" in p]


def outcomes(attempts: pd.DataFrame) -> dict[str, list[tuple[str, str]]]:
    ordered = attempts.sort_values(["problem_id", "iteration"])
    return {
        pid: list(zip(group["outcome"], group["error_class"].fillna("")))
        for pid, group in ordered.groupby("problem_id")
    }


@pytest.fixture
def llm_config(config, tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    for problem_id in ("1_relu", "1_gelu", "1_sum_dim", "1_softmax"):
        shutil.copy(SMOKE / f"{problem_id}.py", suite / f"{problem_id}.py")
    return config.model_copy(
        update={
            "suite": str(suite),
            "results_dir": str(tmp_path / "results"),
            "cache_dir": str(tmp_path / "cache"),  # a reply cache of its own
            "agent": "llm",
            "iterations": 1,
            "performance_agent": True,
        }
    )


def with_endpoint(config, base_url: str, **llm):
    settings = {"model": "scripted", "base_url": base_url, "api_key_env": "KFORGE_TEST_NO_KEY"}
    settings |= {"retries": 2, "retry_delay_s": 0, "timeout_s": 1.5, **llm}
    return config.model_copy(update={"llm": config.llm.model_copy(update=settings)})


def test_agents_refine_record_tokens_survive_endpoint_failures_and_replay_on_retry(prefect_server, llm_config):
    draft = (KERNELS / "drafts" / "1_relu.0.py").read_text()
    scripts = PerProblemScripts(
        {
            # a kernel that does not compile, then the fixed one
            "1_relu": [{"content": f"```python\n{draft}```"}, kernel_reply("1_relu.py")],
            # a 500 then a good kernel; agent G's advice; a hang past the timeout, then the kernel again
            "1_gelu": [
                {"status": 500},
                kernel_reply("1_gelu.py", usage={"prompt_tokens": 1200, "completion_tokens": 300}),
                {"content": f"My analysis:\n```json\n{json.dumps(RECOMMENDATION)}\n```"},
                {"hang_s": 5},
                kernel_reply("1_gelu.py"),
            ],
            # a reply with no code, then a kernel
            "1_sum_dim": [{"content": "Sorry, I cannot help with kernels today."}, kernel_reply("1_sum_dim.py")],
            # an endpoint that stays down through every retry
            "1_softmax": [{"status": 503}] * 3,
        }
    )
    with scripted_openai_server(scripts) as server:
        run_config = with_endpoint(llm_config, server.base_url)
        state = run_suite(run_config, return_state=True)
        assert state.is_failed() and "1_softmax" in state.message and "kforge retry" in state.message

        attempts = results.load("attempts", run_config.results_dir)
        assert outcomes(attempts) == {
            "1_gelu": [("correct", ""), ("correct", "")],
            "1_relu": [("compile_error", "CompileError"), ("correct", "")],
            "1_softmax": [("generation_failed", "endpoint_unavailable")],
            "1_sum_dim": [("generation_failed", "no_code"), ("correct", "")],
        }
        by_key = attempts.set_index(["problem_id", "iteration"])
        assert server.base_url in by_key.loc[("1_softmax", 0), "error_excerpt"]
        assert "HTTP 503" in by_key.loc[("1_softmax", 0), "error_excerpt"]
        assert by_key.loc[("1_sum_dim", 0), "error_excerpt"] == "the reply has no code block"

        # The refinement prompts carry the previous kernel and what happened to it.
        relu_fix = user_prompts(server, "1_relu")[1]
        assert "It failed: compile_error" in relu_fix and "out[i] = x[i]" in relu_fix and "error:" in relu_fix
        assert (
            "Your previous reply had no usable code: the reply has no code block"
            in user_prompts(server, "1_sum_dim")[1]
        )
        # G saw the correct gelu kernel; its recommendation conditioned the next generation.
        gelu_prompts = user_prompts(server, "1_gelu")
        assert len(gelu_prompts) == 5  # 500, kernel, analysis, hang, kernel
        assert "Reply with exactly one JSON object" in gelu_prompts[2]
        assert f"- recommendation: {RECOMMENDATION['recommendation']}" in gelu_prompts[4]
        assert "It is correct:" in gelu_prompts[4]

        gelu_first = by_key.loc[("1_gelu", 0)]
        assert (gelu_first["tokens_in"], gelu_first["tokens_out"]) == (1200, 300)
        assert json.loads(gelu_first["recommendation"]) == RECOMMENDATION
        assert gelu_first["analysis_tokens_in"] > 0 and pd.isna(gelu_first["analysis_error"])
        llm_rows = attempts[attempts["error_class"].fillna("") != "endpoint_unavailable"]
        assert (llm_rows["tokens_in"] > 0).all() and llm_rows["prompt_hash"].notna().all()
        assert set(attempts["model"]) == {"scripted"} and set(attempts["agent"]) == {"llm"}
        assert attempts["performance_agent"].all() and (attempts["max_iterations"] == 1).all()
        assert not attempts["reply_cached"].any()
        # The soft check is off by default: no verdict, no tokens (and no extra prompt, counted above).
        assert attempts["soft_check"].isna().all() and (attempts["soft_check_tokens_in"] == 0).all()

        # The endpoint is back; Retry on the failed flow run asks the model only for what failed.
        scripts.scripts["1_softmax"] = [kernel_reply("1_softmax.py"), {"content": "no JSON here"}]
        scripts.scripts["1_softmax"].append(kernel_reply("1_softmax.py"))
        asked_before = len(server.requests)
        retried = retry_flow_run(run_suite, state.state_details.flow_run_id, {"config": run_config})
        assert retried.is_completed(), retried.message
        new_prompts = [r["body"]["messages"][-1]["content"] for r in server.requests[asked_before:]]
        assert len(new_prompts) == 3 and all("problem_id: 1_softmax\n" in p for p in new_prompts)

    attempts = results.load("attempts", run_config.results_dir)
    assert outcomes(attempts)["1_softmax"] == [("correct", ""), ("correct", "")]
    softmax_first = attempts.set_index(["problem_id", "iteration"]).loc[("1_softmax", 0)]
    assert "no JSON object" in softmax_first["analysis_error"] and pd.isna(softmax_first["recommendation"])
    raw = pd.read_parquet(Path(run_config.results_dir) / "attempts")
    assert (raw["problem_id"] == "1_softmax").sum() == 3  # the failed row is kept on disk, superseded in load()


def test_a_new_run_is_answered_from_the_reply_cache_soft_check_included(prefect_server, llm_config, tmp_path):
    suite = tmp_path / "one"
    suite.mkdir()
    shutil.copy(SMOKE / "1_sum_dim.py", suite / "1_sum_dim.py")
    llm_config = llm_config.model_copy(update={"suite": str(suite), "soft_check": True})
    reason = "forward sums with torch.sum instead of the C++ loop"  # a scripted verdict on an honest kernel
    verdict = {"content": json.dumps({"verdict": "fail", "reason": reason})}
    script = [{"content": "No code, sorry."}, kernel_reply("1_sum_dim.py"), verdict]
    with scripted_openai_server(script) as server:
        first = run_suite(with_endpoint(llm_config, server.base_url))
    assert first["outcomes"] == {"generation_failed": 1, "correct": 1}

    with scripted_openai_server([]) as silent:  # would answer every call with HTTP 500
        second = run_suite(with_endpoint(llm_config, silent.base_url, retries=0))
        assert not [r for r in silent.requests if r["body"]]
    assert second["outcomes"] == first["outcomes"]
    attempts = results.load("attempts", llm_config.results_dir)
    replayed = attempts[attempts["run_id"] == second["run_id"]]
    assert replayed["reply_cached"].all() and (replayed["cost_usd"] == 0).all()
    assert (replayed["tokens_in"] > 0).all()  # the tokens the cached reply cost when it was made
    # The soft check ran on the correct kernel only; its verdict sits beside the outcome, never changing it.
    for run in (first, second):
        rows = attempts[attempts["run_id"] == run["run_id"]].set_index("iteration")
        assert rows.loc[1, ["outcome", "soft_check", "soft_check_reason"]].tolist() == ["correct", "fail", reason]
        assert rows.loc[1, "soft_check_tokens_in"] > 0 and pd.isna(rows.loc[1, "soft_check_error"])
        assert pd.isna(rows.loc[0, "soft_check"]) and rows.loc[0, "outcome"] == "generation_failed"
    assert (attempts["schema_version"] == results.SCHEMA_VERSION).all()


def text_of(message: dict) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content if p["type"] == "text")


@pytest.mark.parametrize(("profile_format", "cycles_only"), [("both", False), ("text", True)])
def test_agent_g_sees_the_distilled_profile_or_times_only(prefect_server, llm_config, profile_format, cycles_only):
    suite = Path(llm_config.suite)
    for extra in ("1_gelu", "1_sum_dim", "1_softmax"):
        (suite / f"{extra}.py").unlink()
    analyses: list[dict] = []

    def respond(body: dict) -> dict:
        message = body["messages"][-1]
        if "Timings (median over timed runs" in text_of(message):
            analyses.append(message)
            return {"content": json.dumps(RECOMMENDATION)}
        return kernel_reply("1_relu.py")

    update = {"profile": True, "profile_format": profile_format, "cycles_only": cycles_only}
    run_config = llm_config.model_copy(update=update)
    with scripted_openai_server(respond) as server:
        state = run_suite(with_endpoint(run_config, server.base_url), return_state=True)
    assert state.is_completed(), state.message
    assert analyses, "agent G was never asked"
    prompt, content = text_of(analyses[0]), analyses[0]["content"]
    images = [p for p in content if p["type"] == "image_url"] if isinstance(content, list) else []
    if cycles_only:
        assert "No profiler output is available" in prompt and not images
    else:  # the distilled summary (torch.profiler on the cpu) and the chart
        assert "Profile of one call (distilled):" in prompt and "torch.profiler" in prompt
        assert "Time per kernel:" in prompt
        assert len(images) == 1 and images[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert not results.load("profiles", run_config.results_dir).empty  # recorded either way
