"""kforge/config.py: settings that imply others."""

import pytest

from kforge.config import RunConfig


def test_optimize_perf_agent_is_kforges_setting_agent_g_with_the_profile_and_no_knowledge_base():
    config = RunConfig(optimize="perf-agent")
    assert config.performance_agent and config.profile
    assert config.optimize != "kb"  # the knowledge-base loop does not run
    plain = RunConfig()
    assert not plain.performance_agent and not plain.profile


def test_an_unknown_optimize_value_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="perf-agent"):
        RunConfig(optimize="genetic")
