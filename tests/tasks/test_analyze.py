"""Agent G's reply parsing: exactly one recommendation in a structured form, or a reason."""

import json

import pytest

from tasks.analyze import parse_recommendation

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
