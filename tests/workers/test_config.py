"""The agent's configuration: NPU_AGENT_ENGINE_HOST, the engine python."""

from __future__ import annotations

import logging

import pytest

from workers.config import AgentConfig, ConfigError, engine_python_from_env

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


def _venv_python(root, venv=".venv-engine"):
    python = root / venv / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


def test_engine_python_is_the_checkouts_engine_env_when_make_engine_env_made_one(tmp_path):
    python = _venv_python(tmp_path)
    assert engine_python_from_env({}, checkout=tmp_path, own="/agent/python") == (
        str(python),
        "this checkout's .venv-engine/, made by make engine-env",
    )


def test_engine_python_is_the_agents_own_without_an_engine_env(tmp_path):
    path, source = engine_python_from_env({}, checkout=tmp_path, own="/agent/python")
    assert path == "/agent/python"
    assert "agent's own" in source


def test_engine_venv_comes_before_the_default_and_is_relative_to_the_checkout(tmp_path):
    _venv_python(tmp_path)
    python = _venv_python(tmp_path, "engines/vllm")
    env = {"ENGINE_VENV": "engines/vllm"}
    assert engine_python_from_env(env, checkout=tmp_path) == (str(python), "ENGINE_VENV")
    absolute = {"ENGINE_VENV": str(tmp_path / "engines/vllm")}
    assert engine_python_from_env(absolute, checkout=tmp_path / "elsewhere")[0] == str(python)


def test_npu_agent_engine_python_comes_first(tmp_path):
    _venv_python(tmp_path)
    chosen = _venv_python(tmp_path, "opt")
    env = {"NPU_AGENT_ENGINE_PYTHON": str(chosen), "ENGINE_VENV": ".venv-engine"}
    assert engine_python_from_env(env, checkout=tmp_path) == (
        str(chosen),
        "NPU_AGENT_ENGINE_PYTHON",
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("NPU_AGENT_ENGINE_PYTHON", "/no/such/python"), ("ENGINE_VENV", "no-such-venv")],
)
def test_a_set_engine_variable_naming_no_interpreter_stops_the_agent(tmp_path, name, value):
    _venv_python(tmp_path)  # a fallback exists: it must not be taken silently
    with pytest.raises(ConfigError, match=name):
        engine_python_from_env({name: value}, checkout=tmp_path)


def test_agent_config_carries_the_engine_python_and_why(tmp_path):
    python = _venv_python(tmp_path)
    config = AgentConfig.from_env(BASE | {"NPU_AGENT_ENGINE_PYTHON": str(python)})
    assert (config.engine_python, config.engine_python_source) == (
        str(python),
        "NPU_AGENT_ENGINE_PYTHON",
    )


def test_the_agent_says_which_engine_python_it_uses_when_it_starts(monkeypatch, caplog, tmp_path):
    from workers import agent

    python = _venv_python(tmp_path)
    config = AgentConfig.from_env(BASE | {"NPU_AGENT_ENGINE_PYTHON": str(python)})
    monkeypatch.setattr(agent.signal, "signal", lambda *args: None)  # keep pytest's handlers
    monkeypatch.setattr(agent, "enroll", lambda config, stop: None)  # stop before Redis
    with caplog.at_level(logging.INFO, logger="workers.agent"):
        assert agent.run(config) == 0
    assert f"engine python: {python} (from NPU_AGENT_ENGINE_PYTHON)" in caplog.text


def test_npu_agent_engine_python_may_be_a_name_on_path(tmp_path):
    assert engine_python_from_env({"NPU_AGENT_ENGINE_PYTHON": "sh"}, checkout=tmp_path) == (
        "sh",
        "NPU_AGENT_ENGINE_PYTHON",
    )
