"""The knowledge-base loop (tasks/optimize.py) through run-suite on a real ephemeral Prefect server, CPU backend,
offline reference agent: rollouts are real attempts, the KB gets a new version, kb_updates records why."""

import json
import re
from pathlib import Path

import pytest
from llm_server import scripted_openai_server
from prefect import tags
from test_run_suite import stage_states
from tests_flows_helpers import retry_flow_run

from flows.suite import run_suite
from kforge import results
from tasks import knowledge

ROOT = Path(__file__).resolve().parents[2]
SMOKE, KERNELS = ROOT / "data" / "problems" / "smoke", ROOT / "kernels_ref" / "cpu"


@pytest.fixture
def kb_config(config, tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    # A source of its own: stage results cached by other tests of this session must not count here.
    (suite / "1_gelu.py").write_text((SMOKE / "1_gelu.py").read_text() + "\n# tests/flows/test_optimize.py\n")
    return config.model_copy(
        update={
            "suite": str(suite),
            "results_dir": str(tmp_path / "results"),
            "kb_dir": str(tmp_path / "knowledge"),
            "iterations": 0,
            "optimize": "kb",
            "rollouts": 2,
            "depth": 1,
        }
    )


def attempt_files(config) -> list[Path]:
    return sorted((Path(config.results_dir) / "attempts").rglob("*.parquet"))


def test_kb_rollouts_are_recorded_update_the_kb_and_replay_on_retry(prefect_server, kb_config):
    kb_config = kb_config.model_copy(update={"depth": 2})
    with tags("kb-first"):
        state = run_suite(kb_config, return_state=True)
    assert state.is_completed(), state.message
    attempts = results.load("attempts", kb_config.results_dir).sort_values(["iteration", "rollout"])
    best = attempts[attempts["rollout"] == 0]
    assert best["outcome"].tolist() == ["correct"] and best["iteration"].tolist() == [0]
    children = attempts[attempts["rollout"] > 0]
    assert list(zip(children["iteration"], children["rollout"])) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert (children["outcome"] == "correct").all() and children["attempt_id"].is_unique
    first_step, second_step = children[children["iteration"] == 1], children[children["iteration"] == 2]
    assert set(first_step["parent_attempt"]) == {best["attempt_id"].iloc[0]}
    # The second step starts from the best kernel so far (the same kernel again: the parent or a child).
    assert set(second_step["parent_attempt"]) <= {best["attempt_id"].iloc[0], *first_step["attempt_id"]}
    configs = [json.loads(c) for c in children["agent_config"]]
    # CPU has none of the seed rules' metrics: the most general state, drawn without a model.
    assert {c["kb_state"] for c in configs} == {"memory-bandwidth-bound"}
    assert [c["kb_version"] for c in configs] == [1, 1, 2, 2]  # the second step draws from the first's version
    techniques = [c["kb_technique"] for c in configs]
    assert len(set(techniques[:2])) == len(set(techniques[2:])) == 2

    kb_dir = Path(kb_config.kb_dir)
    assert knowledge.versions(kb_dir) == [2, 3]
    seed, final = knowledge.load(knowledge.SEED_PATH), knowledge.load(kb_dir / "kb-v3.json")
    assert knowledge.load(kb_dir / "kb-v2.json").kb_version == 2 and final.kb_version == 3
    updates = results.load("kb_updates", kb_config.results_dir).sort_values(["kb_version", "technique"])
    assert list(zip(updates["kb_version"], updates["technique"])) == sorted(zip([2, 2, 3, 3], techniques))
    assert (updates["measured_gain"] > 0).all() and set(updates["problem_id"]) == {"1_gelu"}
    assert sorted(i for ids in updates["attempt_ids"] for i in ids) == sorted(children["attempt_id"])
    for technique in set(techniques):
        before = seed.state("memory-bandwidth-bound").optimization(technique)
        after = final.state("memory-bandwidth-bound").optimization(technique)
        gains = updates.loc[updates["technique"] == technique, "measured_gain"]
        assert after.attempts == before.attempts + techniques.count(technique)
        # The reference agent proposes the parent's own kernel again: a gain near 1 is no success.
        assert after.successes == before.successes + int((gains > 1.0).sum())
        assert after.gpus == ("cpu",) and after.expected_gain != before.expected_gain

    written = attempt_files(kb_config)
    # Retry of the finished run: the KB steps and the rollouts replay from cache, nothing is saved twice.
    with tags("kb-retry"):
        retried = retry_flow_run(run_suite, state.state_details.flow_run_id, {"config": kb_config})
    assert retried.is_completed(), retried.message
    assert knowledge.versions(kb_dir) == [2, 3]
    assert len(results.load("kb_updates", kb_config.results_dir)) == len(updates)
    assert attempt_files(kb_config) == written  # no rollout recorded twice
    # The server records task runs a little after they end: only what no replay may show is asserted here.
    replayed = stage_states("kb-retry")
    assert replayed[("kb-update", "Completed")] == 0 and replayed[("record-attempt", "Completed")] == 0


LEARNED = "Learned on the first problem: vectorize only contiguous, aligned tensors."


def two_problem_run(kb_config, **update) -> tuple[dict, list[str], object]:
    """1_gelu then 1_relu (one at a time) through the KB loop with scripted replies: the kernel, the state,
    and a gap analysis that rewrites every entry tried. Returns the run's summary, the prompts, the config."""
    smoke = Path(kb_config.suite)
    (smoke / "1_relu.py").write_text((SMOKE / "1_relu.py").read_text() + "\n# tests/flows/test_optimize.py\n")

    def respond(body: dict) -> dict:
        prompt = body["messages"][-1]["content"]
        if prompt.startswith("Distilled metrics of the kernel"):
            state = {"state": "memory-bandwidth-bound", "primary_bottleneck": "DRAM", "reason": "one pass"}
            return {"content": json.dumps(state)}
        if prompt.startswith("Performance state:"):
            return {"content": json.dumps({"explanation": "the same kernel again", "description": LEARNED})}
        problem_id = re.search(r"problem_id: (\S+)", prompt).group(1)
        return {"content": f"```python\n{(KERNELS / f'{problem_id}.py').read_text()}```\n"}

    run_config = kb_config.model_copy(
        update={"agent": "llm", "rollouts": 3, "cache_dir": str(Path(kb_config.results_dir).parent / "cache"), **update}
    )
    with scripted_openai_server(respond) as server:
        settings = {"model": "scripted", "base_url": server.base_url, "api_key_env": "KFORGE_TEST_NO_KEY"}
        run_config = run_config.model_copy(update={"llm": run_config.llm.model_copy(update=settings)})
        state = run_suite(run_config, return_state=True)
        assert state.is_completed(), state.message
        prompts = [r["body"]["messages"][-1]["content"] for r in server.requests if r["body"]]
    return state.result(), prompts, run_config


def test_what_one_problem_learns_is_shown_to_the_next_problems_rollouts(prefect_server, kb_config):
    summary, prompts, run_config = two_problem_run(kb_config)
    learned = LEARNED

    generation = {pid: [p for p in prompts if f"problem_id: {pid}\n" in p] for pid in ("1_gelu", "1_relu")}
    assert len(generation["1_gelu"]) == len(generation["1_relu"]) == 4  # the kernel, then 3 rollouts
    assert not any(learned in p for p in generation["1_gelu"])
    # 1_gelu's gap analysis rewrote every entry it tried (kb v2); 1_relu's rollouts are told the new text.
    assert all(learned in p and "knowledge base v2" in p for p in generation["1_relu"][1:])
    assert sum(p.startswith("Distilled metrics of the kernel") for p in prompts) == 2
    assert knowledge.versions(run_config.kb_dir) == [2, 3]
    updates = results.load("kb_updates", run_config.results_dir)
    assert set(updates.loc[updates["problem_id"] == "1_gelu", "rationale"]) >= {"the same kernel again"}

    assert (summary["kb_version_start"], summary["kb_version_end"]) == (1, 3)
    # the KB agents' own tokens (state and gap calls), one accounting row per problem's step
    spent = updates[updates["technique"] == ""]
    assert sorted(spent["problem_id"]) == ["1_gelu", "1_relu"] and (spent["tokens"] > 0).all()
    assert updates.loc[updates["technique"] != "", "tokens"].isna().all()
    assert set(summary["tokens"]) == {"1_gelu", "1_relu"} and all(n > 0 for n in summary["tokens"].values())


def test_without_memory_the_next_problem_starts_from_the_seed(prefect_server, kb_config):
    summary, prompts, run_config = two_problem_run(kb_config, kb_memory=False)
    generation = {pid: [p for p in prompts if f"problem_id: {pid}\n" in p] for pid in ("1_gelu", "1_relu")}
    assert len(generation["1_gelu"]) == len(generation["1_relu"]) == 4
    # 1_gelu still learned (its gap analysis ran), but 1_relu's rollouts see the seed's entries only.
    assert not any(LEARNED in p for p in generation["1_relu"])
    assert all("knowledge base v1" in p for p in generation["1_relu"][1:])
    assert knowledge.versions(run_config.kb_dir) == []  # the shared knowledge base is untouched
    own = Path(run_config.cache_dir) / "kb-no-memory" / summary["run_id"]
    assert knowledge.versions(own / "1_gelu") == [2] and knowledge.versions(own / "1_relu") == [2]
    assert "kb_version_start" not in summary
