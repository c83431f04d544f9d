"""The agent's configuration: NPU_AGENT_ENGINE_HOST."""

from __future__ import annotations

import pytest

from workers.config import AgentConfig, ConfigError

BASE = {"NPU_AGENT_BROKER_URL": "redis://broker:6379/0", "NPU_AGENT_NODE_NAME": "n1"}


def test_engine_host_is_unset_by_default_so_the_spec_decides():
    assert AgentConfig.from_env(BASE).engine_host is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("10.20.0.5", "10.20.0.5"), (" 10.20.0.5 ", "10.20.0.5"), ("[fd00::5]", "fd00::5")],
)
def test_engine_host_takes_an_ip_address(value, expected):
    config = AgentConfig.from_env(BASE | {"NPU_AGENT_ENGINE_HOST": value})
    assert config.engine_host == expected


@pytest.mark.parametrize("value", ["npu-1.example", "10.0.0.5:8100", "0.0.0.0 --api-key x"])
def test_engine_host_refuses_anything_but_an_address(value):
    with pytest.raises(ConfigError, match="NPU_AGENT_ENGINE_HOST"):
        AgentConfig.from_env(BASE | {"NPU_AGENT_ENGINE_HOST": value})
