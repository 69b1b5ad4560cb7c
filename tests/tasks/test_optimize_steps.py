"""tasks/optimize.py's plain steps: metrics from rows and profiles, the state fallback, seeded selection, rollout
rows and a save that lost the race for its version number. (Not test_optimize.py: tests/flows has that basename.)"""

import json
from dataclasses import replace

from kforge.config import RunConfig
from tasks import knowledge, optimize
from tasks.knowledge import Rollout
from tasks.problems import parse_problem
from tasks.record import attempt_id

SEED = knowledge.load(knowledge.SEED_PATH)


def ncu_row(instance: str, metric: str, value: float, unit: str = "%") -> dict:
    return {"tool": "ncu", "instance": instance, "metric": metric, "value": value, "unit": unit}


def test_ncu_metrics_are_weighted_by_launch_duration_and_match_the_seed_rules():
    rows = [
        ncu_row("0", "Duration", 3.0, "usecond"),
        ncu_row("0", "DRAM Throughput", 80.0),
        ncu_row("0", "Compute (SM) Throughput", 20.0),
        ncu_row("1", "Duration", 1000.0, "nsecond"),
        ncu_row("1", "DRAM Throughput", 40.0),
        ncu_row("1", "Compute (SM) Throughput", 60.0),
    ]
    metrics = optimize.distil_metrics({"runtime_ms": 0.01, "roofline_fraction": 0.5}, rows)
    assert metrics["dram_throughput_pct"] == 70.0 and metrics["sm_throughput_pct"] == 30.0
    assert metrics["kernel_launches"] == 2 and metrics["roofline_pct"] == 50.0
    assert knowledge.extract_state(metrics, SEED) == ("memory-bandwidth-bound", 1.0)


def test_torch_profiler_gives_launches_and_the_idle_share_of_the_runtime():
    rows = [
        {"tool": "torch.profiler", "section": "cuda_kernels", "metric": "calls", "value": 4.0},
        {"tool": "torch.profiler", "section": "cuda_kernels", "metric": "self_time_us", "value": 250.0},
        {"tool": "torch.profiler", "section": "cpu_ops", "metric": "calls", "value": 9.0},
    ]
    metrics = optimize.distil_metrics({"runtime_ms": 1.0}, rows)
    assert metrics == {"runtime_ms": 1.0, "kernel_launches": 4.0, "cpu_op_calls": 9.0, "launch_overhead_pct": 75.0}


def test_without_matching_rules_or_a_model_the_most_general_state_is_used_and_the_log_says_why():
    choice = optimize.choose_state({"runtime_ms": 1.0}, SEED, RunConfig())
    assert choice.state == "memory-bandwidth-bound"  # two rules, first in the seed
    assert "fallback" in choice.how and "no rule matched" in choice.how and "no model" in choice.how


def test_selection_is_the_same_for_the_same_run_problem_and_step():
    config = RunConfig(rollouts=2)
    first = optimize.plan_rollouts(SEED, "occupancy-limited", config, "run-1", "1_gelu", 0)
    assert first == optimize.plan_rollouts(SEED, "occupancy-limited", config, "run-1", "1_gelu", 0)
    assert len({technique for technique, _ in first}) == 2
    technique, recommendation = first[0]
    assert set(recommendation) == {"bottleneck", "recommendation", "expected_effect"}
    assert recommendation["recommendation"].startswith(f"{technique}: ")
    draws = {
        tuple(t for t, _ in optimize.plan_rollouts(SEED, "occupancy-limited", config, f"r{i}", "p", 0))
        for i in range(30)
    }
    assert len(draws) > 1  # weighted random, not argmax


def test_a_rollout_row_has_its_own_attempt_id_and_names_its_parent():
    problem = parse_problem(knowledge.SEED_PATH.parents[1] / "problems" / "smoke" / "1_gelu.py")
    parent = {"attempt_id": "p0", "runtime_ms": 2.0}
    row = {"attempt_id": "x", "run_id": "r", "iteration": 1, "agent_config": "{}", "rollout": 0, "outcome": "correct"}
    child = optimize.as_rollout_row({**row, "runtime_ms": 1.0}, problem, parent, 2, "s", "t", 1)
    assert child["rollout"] == 2 and child["parent_attempt"] == "p0"
    assert child["attempt_id"] == attempt_id("r", problem, 1, 2) != attempt_id("r", problem, 1)
    assert json.loads(child["agent_config"]) == {"kb_state": "s", "kb_technique": "t", "kb_version": 1}
    assert optimize.measured_gain(parent, child) == 2.0
    assert optimize.measured_gain(parent, {**child, "outcome": "compile_error", "runtime_ms": None}) is None


def test_a_save_that_lost_its_version_number_updates_the_winners_version(tmp_path):
    config = RunConfig(kb_dir=str(tmp_path))
    replay = [Rollout("a1", "memory-bandwidth-bound", "operator-fusion", 1.5, "cpu")]
    winner, _ = knowledge.numeric_update(SEED, replay)
    knowledge.save_version(winner, tmp_path)  # another problem saved v2 after this one loaded v1
    saved = optimize.save_update(SEED, [replace(replay[0], attempt_id="a2")], config)
    assert saved.kb.kb_version == 3 and knowledge.versions(tmp_path) == [2, 3]
    assert saved.kb.state("memory-bandwidth-bound").optimization("operator-fusion").attempts == 2
    rows = optimize.kb_update_rows(saved, "run-1", "1_gelu")
    assert [(r["kb_version"], r["attempt_ids"], r["problem_id"]) for r in rows] == [(3, ["a2"], "1_gelu")]


def test_a_state_the_model_names_is_added_to_the_knowledge_base_with_the_fallbacks_techniques(tmp_path):
    from llm_server import scripted_openai_server

    reply = {"state": "Register Spilling Bound", "primary_bottleneck": "local memory traffic", "reason": "spills"}
    with scripted_openai_server([{"content": json.dumps(reply)}]) as server:
        llm = {"model": "scripted", "base_url": server.base_url, "api_key_env": "KFORGE_TEST_NO_KEY"}
        config = RunConfig(cache_dir=str(tmp_path / "cache"), kb_dir=str(tmp_path / "kb"))
        config = config.model_copy(update={"llm": config.llm.model_copy(update=llm)})
        choice = optimize.choose_state({"runtime_ms": 1.0}, SEED, config)
    assert choice.state == "register-spilling-bound" and "new state" in choice.how
    new = choice.new_state
    assert new is not None and new.rules == () and new.primary_bottleneck == "local memory traffic"
    fallback = SEED.state(optimize.fallback_state(SEED))
    assert [o.technique for o in new.optimizations] == [o.technique for o in fallback.optimizations]
    assert all(o.attempts == 0 and o.mean_gain is None for o in new.optimizations)
    # The rules never claim a state without rules; the step's save keeps it, with a kb_updates row.
    kb = knowledge.with_state(SEED, new)
    assert knowledge.extract_state({"runtime_ms": 1.0}, kb) == (None, 0.0)
    technique = new.optimizations[0].technique
    numeric_only = config.model_copy(update={"llm": RunConfig().llm})
    saved = optimize.save_update(kb, [Rollout("a1", new.name, technique, 1.4, "cpu")], numeric_only)
    reloaded = knowledge.load(saved.path)
    assert reloaded.kb_version == 2 and reloaded.state(new.name).optimization(technique).attempts == 1
    rows = optimize.kb_update_rows(saved, "run-1", "1_gelu")
    assert {(r["state"], r["technique"]) for r in rows} >= {(new.name, ""), (new.name, technique)}
    assert any(r["rationale"].startswith("new state (local memory traffic)") for r in rows)
    # Named again by the model later, the same state is reused, not added twice.
    with scripted_openai_server([{"content": json.dumps(reply)}]) as server:
        llm = {"model": "scripted", "base_url": server.base_url, "api_key_env": "KFORGE_TEST_NO_KEY"}
        config = config.model_copy(update={"llm": config.llm.model_copy(update=llm), "cache_dir": str(tmp_path / "c2")})
        again = optimize.choose_state({"runtime_ms": 1.0}, reloaded, config)
    assert again.state == new.name and again.new_state is None
