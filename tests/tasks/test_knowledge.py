"""The knowledge base: state rules, the selector's distribution, versioning, numeric and textual updates,
diff, and the `kforge kb` commands."""

import hashlib
import json
import math
import random
from collections import Counter
from dataclasses import replace

import pytest
from llm_server import scripted_openai_server
from typer.testing import CliRunner

from kforge.config import ModelSettings
from kforge.kb import export, import_file, kb_app, show
from tasks.knowledge import (
    PRIOR_WEIGHT,
    SEED_PATH,
    UNTRIED_PRIOR_GAIN,
    KbFormatError,
    KnowledgeBase,
    Optimization,
    Rollout,
    Rule,
    State,
    diff,
    extract_state,
    load,
    load_latest,
    numeric_update,
    parse_state_reply,
    save_version,
    select,
    selection_weights,
    state_prompt,
    textual_update,
    to_document,
    version_path,
)
from tasks.llm import chat

SEED = load(SEED_PATH)
MEMORY = "memory-bandwidth-bound"


def test_the_seed_is_version_1_with_the_required_states():
    assert SEED.kb_version == 1
    names = {s.name for s in SEED.states}
    assert {MEMORY, "latency-launch-bound", "compute-bound-no-tensor-cores", "occupancy-limited"} <= names
    assert "uncoalesced-access" in names
    assert all(2 <= len(s.optimizations) <= 4 and s.rules for s in SEED.states)


@pytest.mark.parametrize(
    "metrics, state, confidence",
    [
        ({"dram_throughput_pct": 85, "sm_throughput_pct": 20}, MEMORY, 1.0),
        ({"launch_overhead_pct": 55, "dram_throughput_pct": 5, "sm_throughput_pct": 8}, "latency-launch-bound", 1.0),
        (
            {"sm_throughput_pct": 90, "tensor_pipe_pct": 0, "dram_throughput_pct": 30},
            "compute-bound-no-tensor-cores",
            1.0,
        ),
        (
            {
                "achieved_occupancy_pct": 12,
                "dram_throughput_pct": 30,
                "sm_throughput_pct": 35,
                "launch_overhead_pct": 2,
            },
            "occupancy-limited",
            1.0,
        ),
        # also satisfies memory-bandwidth-bound (2 rules): the more specific state (3 rules) wins, less sure
        (
            {"sectors_per_request": 16, "dram_bytes_ratio": 4, "dram_throughput_pct": 75, "sm_throughput_pct": 10},
            "uncoalesced-access",
            3 / 5,
        ),
    ],
)
def test_each_seed_state_is_recognised_by_its_rules(metrics, state, confidence):
    assert extract_state(metrics, SEED) == (state, pytest.approx(confidence))


def test_no_match_or_an_equal_tie_returns_none_and_the_model_is_asked():
    balanced = {"dram_throughput_pct": 70, "sm_throughput_pct": 70, "tensor_pipe_pct": 50}
    assert extract_state(balanced, SEED) == (None, 0.0)
    assert extract_state({}, SEED) == (None, 0.0)  # nothing measured confirms nothing
    twin = State(
        "bank-conflicts",
        "shared memory",
        (),
        (Rule("dram_throughput_pct", ">=", 50), Rule("sm_throughput_pct", "<=", 40)),
        SEED.state(MEMORY).optimizations,
    )
    tied = replace(SEED, states=(*SEED.states, twin))
    assert extract_state({"dram_throughput_pct": 85, "sm_throughput_pct": 20}, tied) == (None, 0.5)
    prompt = state_prompt(balanced, SEED)[1]["content"]
    assert "dram_throughput_pct: 70" in prompt and "occupancy-limited" in prompt and "sm_throughput_pct >= 60" in prompt
    reply = 'It is balanced.\n```json\n{"state": "balanced", "primary_bottleneck": "both", "reason": "70/70"}\n```'
    assert parse_state_reply(reply)[0].state == "balanced"
    assert parse_state_reply('{"state": "x"}') == (
        None,
        "the state reply has no JSON object with state, primary_bottleneck, reason",
    )


def _opt(technique, gain, attempts=5):
    return Optimization(technique, f"apply {technique}", gain, attempts=attempts, successes=min(attempts, 2))


GAINS = {"big": 3.0, "medium": 1.5, "small": 1.05, "new": None}
STATE = State("s", "b", (), (Rule("m", ">=", 1),), tuple(_opt(t, g, 0 if g is None else 5) for t, g in GAINS.items()))
KB = KnowledgeBase(1, (STATE,))


def _frequencies(temperature, draws=5000, seed=1234):
    rng = random.Random(seed)
    counts = Counter(select(KB, "s", 1, temperature, rng)[0] for _ in range(draws))
    return {t: counts[t] / draws for t in GAINS}


def test_the_selector_prefers_high_gain_but_still_explores():
    freq = _frequencies(1.0)
    expected = selection_weights(STATE, 1.0)
    # p ∝ g^(1/T); the untried technique uses the prior
    total = 3.0 + 1.5 + 1.05 + UNTRIED_PRIOR_GAIN
    assert expected == pytest.approx(
        {"big": 3.0 / total, "medium": 1.5 / total, "small": 1.05 / total, "new": UNTRIED_PRIOR_GAIN / total}
    )
    for technique, p in expected.items():  # within 4 standard errors of the binomial
        assert abs(freq[technique] - p) < 4 * math.sqrt(p * (1 - p) / 5000), technique
    assert freq["big"] > freq["medium"] > freq["small"] > 0.1 and freq["new"] > 0.1


def test_temperature_concentrates_when_low_and_flattens_when_high():
    cold, hot = _frequencies(0.1), _frequencies(50.0)
    assert cold["big"] > 0.99
    assert max(hot.values()) - min(hot.values()) < 0.04 and all(abs(p - 0.25) < 0.03 for p in hot.values())
    with pytest.raises(ValueError, match="never plain argmax"):
        select(KB, "s", 1, 0.0, random.Random(0))


def test_top_k_draws_are_distinct_and_reproducible():
    first = select(KB, "s", 3, 1.0, random.Random(7))
    assert len(set(first)) == 3 and first == select(KB, "s", 3, 1.0, random.Random(7))
    assert sorted(select(KB, "s", 10, 1.0, random.Random(7))) == sorted(GAINS)


def test_an_update_writes_a_new_version_and_leaves_the_old_and_the_seed_alone(tmp_path):
    seed_digest = hashlib.sha256(SEED_PATH.read_bytes()).hexdigest()
    kb_dir = tmp_path / "kb"
    assert load_latest(kb_dir) == SEED
    v1_path = save_version(SEED, kb_dir)
    v1_bytes = v1_path.read_bytes()
    new_kb, _ = numeric_update(SEED, [Rollout("a1", MEMORY, "vectorized-access", 1.6, "H200")])
    v2_path = save_version(new_kb, kb_dir)
    assert v2_path == version_path(kb_dir, 2) and new_kb.kb_version == 2
    assert load_latest(kb_dir) == new_kb and load(v2_path) == new_kb
    assert load(v1_path) == SEED and v1_path.read_bytes() == v1_bytes
    with pytest.raises(FileExistsError):
        save_version(replace(new_kb, source="another run"), kb_dir)
    assert load(v2_path) == new_kb
    assert hashlib.sha256(SEED_PATH.read_bytes()).hexdigest() == seed_digest
    assert sorted(p.name for p in kb_dir.iterdir()) == ["kb-v1.json", "kb-v2.json"]  # no temporary files left


def test_the_numeric_update_moves_the_expected_gain_by_the_documented_amount():
    replay = [
        Rollout("a1", MEMORY, "vectorized-access", 2.0, "H200"),
        Rollout("a2", MEMORY, "vectorized-access", 1.0 / 1.1, "H100"),  # correct but slower
        Rollout("a3", MEMORY, "vectorized-access", None, "H200"),  # failed: counts as 1.0
        Rollout("a4", MEMORY, "operator-fusion", 1.8, "H200"),
    ]
    new_kb, updates = numeric_update(SEED, replay)
    old = SEED.state(MEMORY).optimization("vectorized-access")
    new = new_kb.state(MEMORY).optimization("vectorized-access")
    gains = [2.0, 1 / 1.1, 1.0]
    log_expected = (PRIOR_WEIGHT * math.log(1.3) + sum(math.log(g) for g in gains)) / (PRIOR_WEIGHT + 3)
    assert new.expected_gain == pytest.approx(math.exp(log_expected))
    measured_geomean = math.exp(sum(math.log(g) for g in gains) / 3)  # 1.22: below the expected 1.3
    assert measured_geomean < new.expected_gain < old.expected_gain
    assert (new.attempts, new.successes, new.gpus) == (3, 1, ("H100", "H200"))
    mean = sum(gains) / 3
    assert new.mean_gain == pytest.approx(mean)
    assert new.gain_spread == pytest.approx(math.sqrt(sum((g - mean) ** 2 for g in gains) / 3))
    # a second batch: the old attempts now weigh in, and mean/spread pool over all six
    more = [Rollout(f"b{i}", MEMORY, "vectorized-access", g, "H200") for i, g in enumerate([1.2, 1.4, 1.3])]
    newer_kb, _ = numeric_update(new_kb, more)
    newer = newer_kb.state(MEMORY).optimization("vectorized-access")
    weight = PRIOR_WEIGHT + 3
    log_newer = (weight * math.log(new.expected_gain) + sum(math.log(g) for g in [1.2, 1.4, 1.3])) / (weight + 3)
    assert newer.expected_gain == pytest.approx(math.exp(log_newer))
    everything = gains + [1.2, 1.4, 1.3]
    all_mean = sum(everything) / 6
    assert (newer.attempts, newer.successes, newer.mean_gain) == (6, 4, pytest.approx(all_mean))
    assert newer.gain_spread == pytest.approx(math.sqrt(sum((g - all_mean) ** 2 for g in everything) / 6))
    # the rows
    assert [(u.kb_version, u.technique, u.attempt_ids) for u in updates] == [
        (2, "vectorized-access", ("a1", "a2", "a3")),
        (2, "operator-fusion", ("a4",)),
    ]
    assert updates[0].measured_gain == pytest.approx((2.0 + 1 / 1.1) / 2)  # the failed one measured nothing
    assert updates[0].expected_gain == new.expected_gain and "1.3 -> " in updates[0].rationale
    untouched = new_kb.state("occupancy-limited")
    assert untouched == SEED.state("occupancy-limited")
    assert numeric_update(SEED, []) == (SEED, [])
    with pytest.raises(ValueError, match="not in the KB"):
        numeric_update(SEED, [Rollout("z", MEMORY, "no-such-technique", 1.0, "H200")])


def _llm(server, tmp_path):
    settings = ModelSettings(model="scripted", base_url=server.base_url, api_key_env="KFORGE_TEST_NO_KEY")
    return lambda messages: chat(settings, messages, tmp_path).text


REWRITE = {
    "explanation": "The loads were already 16-byte aligned after fusion, so vectorizing saved only instructions.",
    "description": "Use float4 loads only when the data is not already coalesced into full sectors; check alignment.",
}


def test_the_textual_update_rewrites_the_description_through_a_real_endpoint(tmp_path):
    replay = [Rollout("a1", MEMORY, "vectorized-access", 1.02, "H200", notes="dram 91% of peak before and after")]
    reply = f"Here is my analysis.\n```json\n{json.dumps(REWRITE)}\n```"
    with scripted_openai_server([{"content": reply}]) as server:
        new_kb, updates, skipped = textual_update(SEED, replay, _llm(server, tmp_path))
    [request] = [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]
    sent = request["messages"][1]["content"]
    assert "vectorized-access" in sent and "1.02x" in sent and "dram 91% of peak" in sent and "1.3x" in sent
    assert new_kb.kb_version == 2 and skipped == []
    assert new_kb.state(MEMORY).optimization("vectorized-access").description == REWRITE["description"]
    assert [u.row() for u in updates] == [
        {
            "kb_version": 2,
            "state": MEMORY,
            "technique": "vectorized-access",
            "expected_gain": 1.3,
            "measured_gain": 1.02,
            "rationale": REWRITE["explanation"],
            "attempt_ids": ["a1"],
            "tokens": None,  # tokens are on the step's accounting row (tasks/optimize.py)
        }
    ]
    assert "description rewritten" in diff(SEED, new_kb)


def test_a_reply_without_usable_text_leaves_the_kb_unchanged_and_says_why(tmp_path):
    replay = [
        Rollout("a1", MEMORY, "vectorized-access", 1.02, "H200"),
        Rollout("a2", MEMORY, "operator-fusion", 1.9, "H200"),
    ]
    script = [{"content": "I think it went fine."}, {"content": json.dumps({"explanation": "x", "description": ""})}]
    with scripted_openai_server(script) as server:
        new_kb, updates, skipped = textual_update(SEED, replay, _llm(server, tmp_path))
    assert new_kb is SEED and updates == []
    why = "unchanged: the gap-analysis reply has no JSON object with explanation and description"
    assert skipped == [f"{MEMORY}/vectorized-access {why}", f"{MEMORY}/operator-fusion {why}"]


def test_diff_names_added_states_changed_gains_and_rewritten_descriptions():
    a = KnowledgeBase(3, (STATE,))
    changed = replace(
        STATE,
        optimizations=(
            replace(STATE.optimizations[0], expected_gain=2.5, attempts=6, successes=3, description="apply big, tiled"),
            *STATE.optimizations[1:3],
            Optimization("brand-new", "try it", None),
        ),
    )
    extra = State("t", "c", (), (Rule("m", "<", 1),), (Optimization("x", "do x", 1.4),))
    b = KnowledgeBase(4, (changed, extra))
    assert diff(a, b).splitlines() == [
        "kb_version 3 -> 4",
        "- s/new",
        "~ s/big expected gain 3 -> 2.5",
        "~ s/big attempts 5 -> 6, successes 2 -> 3",
        "~ s/big description rewritten:",
        "    old: apply big",
        "    new: apply big, tiled",
        "+ s/brand-new expected none",
        "+ state t (1 techniques)",
        "+ t/x expected 1.4",
    ]
    assert diff(a, a) == "no differences"


def test_show_export_and_import(tmp_path):
    table = show(SEED).splitlines()
    assert table[0] == "knowledge base version 1"
    assert table[1].split() == ["state", "technique", "expected", "attempts", "successes", "mean", "spread", "gpus"]
    assert table[2].split()[:5] == [MEMORY, "vectorized-access", "1.3", "0", "0"]
    exported = export(SEED_PATH, tmp_path / "out" / "kb.json")
    assert load(exported) == SEED
    kb_dir = tmp_path / "kb"
    path = import_file(exported, kb_dir)
    assert path.name == "kb-v2.json" and load(path).states == SEED.states  # after the seed, so the next run loads it
    assert load_latest(kb_dir).kb_version == 2


@pytest.mark.parametrize(
    "content, complaint",
    [
        ("{not json", "not JSON"),
        (json.dumps({**to_document(SEED), "kb_version": "1"}), "kb_version must be a positive integer, got '1'"),
        (
            json.dumps({"kb_version": 1, "states": [{**to_document(SEED)["states"][0], "optimizations": []}]}),
            f"state '{MEMORY}' has no optimizations",
        ),
    ],
)
def test_kb_import_of_a_malformed_file_is_one_line_naming_the_file(tmp_path, content, complaint):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(KbFormatError) as caught:
        import_file(bad, tmp_path / "kb")
    message = str(caught.value)
    assert message.startswith(f"{bad}: ") and complaint in message and "\n" not in message
    result = CliRunner().invoke(kb_app, ["import", str(bad), "--kb-dir", str(tmp_path / "kb")])
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert str(bad) in line and complaint in line
    assert not (tmp_path / "kb").exists() or not list((tmp_path / "kb").iterdir())


def test_the_cli_shows_and_diffs(tmp_path):
    kb_dir = tmp_path / "kb"
    new_kb, _ = numeric_update(SEED, [Rollout("a1", MEMORY, "operator-fusion", 2.4, "H200")])
    save_version(new_kb, kb_dir)
    shown = CliRunner().invoke(kb_app, ["show", "--kb-dir", str(kb_dir)])
    assert shown.exit_code == 0 and "knowledge base version 2" in shown.output and "H200" in shown.output
    diffed = CliRunner().invoke(kb_app, ["diff", str(SEED_PATH), str(kb_dir)])
    assert diffed.exit_code == 0
    assert f"~ {MEMORY}/operator-fusion expected gain 1.8 -> " in diffed.output
