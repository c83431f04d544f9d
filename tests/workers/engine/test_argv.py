"""The engine's argv and environment, CANN's set_env.sh, and redaction."""

from __future__ import annotations

import pytest

from workers.contracts import EngineSpec
from workers.engine import argv as engine_argv
from workers.engine.argv import (
    build_argv,
    build_env,
    cann_environment,
    redact_argv,
    redact_env,
)

AGENT_ENV = {
    "PATH": "/opt/agent/bin:/usr/bin",
    "HOME": "/home/agent",
    "LD_LIBRARY_PATH": "/opt/lib",
    "HCCL_CONNECT_TIMEOUT": "300",
    "VLLM_ASCEND_ENABLE_NZ": "1",
    "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    "HF_TOKEN": "hf_abc",
    "NPU_AGENT_ENROLL_TOKEN": "enroll-secret",
    "NPU_AGENT_BROKER_URL": "redis://:pw@broker:6379/0",
    "HTTP_PROXY": "http://proxy:3128",
}


def make_spec(**fields) -> EngineSpec:
    values = dict(
        replica_id=7,
        generation=2,
        deployment="qwen",
        model_path="/models/qwen",
        served_model_name="qwen",
        port=8001,
        npu_ids=[4, 5],
        tensor_parallel_size=2,
    )
    return EngineSpec(**(values | fields))


def test_minimal_argv_has_only_the_required_flags():
    """On CPU: the NPU-only memory share (a row of workers/engine_settings.py) is left out."""
    assert build_argv(make_spec(device="cpu"), "/venv/bin/python") == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/qwen",
        "--served-model-name",
        "qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--tensor-parallel-size",
        "2",
    ]


def test_optional_flags_appear_when_set_then_extra_args():
    spec = make_spec(
        pipeline_parallel_size=2,
        dtype="bfloat16",
        max_model_len=4096,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.9,
        block_size=128,
        enforce_eager=True,
        quantization="ascend",
        trust_remote_code=True,
        extra_args=["--seed", "1"],
    )
    tail = build_argv(spec, "py")[13:]
    assert tail == [
        "--pipeline-parallel-size", "2", "--dtype", "bfloat16", "--max-model-len", "4096",
        "--max-num-seqs", "64", "--max-num-batched-tokens", "8192",
        "--gpu-memory-utilization", "0.9", "--block-size", "128",
        "--enforce-eager", "--quantization", "ascend", "--trust-remote-code", "--seed", "1",
    ]  # fmt: skip
    assert "--pipeline-parallel-size" not in build_argv(make_spec(pipeline_parallel_size=1), "py")


def test_npu_engines_get_the_tables_memory_share_by_default():
    argv = build_argv(make_spec(), "py")
    assert argv[13:] == ["--gpu-memory-utilization", "0.9"]


def test_npu_env_selects_the_spec_npus_and_keeps_only_allowed_variables():
    env = build_env(make_spec(extra_env={"HCCL_BUFFSIZE": "512"}), AGENT_ENV)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5"  # never the agent's own
    assert env["HCCL_CONNECT_TIMEOUT"] == "300" and env["VLLM_ASCEND_ENABLE_NZ"] == "1"
    assert env["HCCL_BUFFSIZE"] == "512"
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        assert env[name] == "1"
    for name in ("HF_TOKEN", "NPU_AGENT_ENROLL_TOKEN", "NPU_AGENT_BROKER_URL", "HTTP_PROXY"):
        assert name not in env
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_cpu_env_sizes_the_kv_cache_and_selects_no_npu():
    env = build_env(make_spec(device="cpu"), AGENT_ENV)
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    env = build_env(make_spec(device="cpu", extra_env={"VLLM_CPU_KVCACHE_SPACE": "4"}), AGENT_ENV)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_cann_environment_is_merged_with_path_lists_first():
    cann = {"LD_LIBRARY_PATH": "/usr/local/Ascend/lib64:/opt/lib", "ASCEND_HOME_PATH": "/a"}
    env = build_env(make_spec(), AGENT_ENV, cann)
    assert env["LD_LIBRARY_PATH"] == "/usr/local/Ascend/lib64:/opt/lib"
    assert env["ASCEND_HOME_PATH"] == "/a"


def test_redaction_of_env_and_argv():
    shown = redact_env(AGENT_ENV | {"VLLM_API_KEY": "k", "DB_PASSWORD_FILE": "/p"})
    assert shown["HF_TOKEN"] == shown["NPU_AGENT_ENROLL_TOKEN"] == shown["VLLM_API_KEY"] == "***"
    assert shown["DB_PASSWORD_FILE"] == "***"
    assert shown["NPU_AGENT_BROKER_URL"] == "redis://:***@broker:6379/0"
    assert shown["HCCL_CONNECT_TIMEOUT"] == "300" and shown["PATH"] == AGENT_ENV["PATH"]
    argv = ["py", "--api-key", "s3cret", "--hf-token=abc", "--port", "8000"]
    assert redact_argv(argv) == ["py", "--api-key", "***", "--hf-token=***", "--port", "8000"]


@pytest.fixture
def fresh_cache():
    engine_argv._sourced.cache_clear()
    yield
    engine_argv._sourced.cache_clear()


def test_cann_environment_sources_the_script_once(tmp_path, fresh_cache):
    count = tmp_path / "count"
    script = tmp_path / "set env.sh"  # a space: the path is an argument, never code
    script.write_text(
        f'echo x >> "{count}"\n'
        "export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest\n"
        'export LD_LIBRARY_PATH="$ASCEND_TOOLKIT_HOME/lib64:$LD_LIBRARY_PATH"\n'
        "echo 'noise on stdout'\n"
    )
    found = cann_environment(str(script))
    assert found == {
        "ASCEND_TOOLKIT_HOME": "/usr/local/Ascend/ascend-toolkit/latest",
        "LD_LIBRARY_PATH": "/usr/local/Ascend/ascend-toolkit/latest/lib64:",
    }
    assert cann_environment(str(script)) == found
    assert count.read_text() == "x\n"  # cached


def test_cann_environment_is_none_without_the_file(tmp_path, fresh_cache):
    assert cann_environment(str(tmp_path / "absent.sh")) is None


@pytest.mark.security
def test_the_replica_key_is_in_the_env_never_in_argv():
    key = "0123456789abcdef" * 4
    spec = make_spec(api_key=key)
    argv = build_argv(spec, "/venv/bin/python")
    assert key not in " ".join(argv) and not any("api-key" in a for a in argv)
    env = build_env(spec, AGENT_ENV | {"VLLM_API_KEY": "the-agents-own"})
    assert env["VLLM_API_KEY"] == key
    assert redact_env(env)["VLLM_API_KEY"] == "***"


@pytest.mark.security
def test_without_a_replica_key_the_agents_own_vllm_api_key_is_not_inherited():
    env = build_env(make_spec(), AGENT_ENV | {"VLLM_API_KEY": "the-agents-own"})
    assert "VLLM_API_KEY" not in env


@pytest.mark.parametrize(
    "fields",
    [
        {"api_key": "short"},
        {"api_key": "has space in it 0123456789"},
        {"api_key": "x" * 129},
        {"extra_env": {"VLLM_API_KEY": "0123456789abcdef"}},
        {"extra_args": ["--api-key", "0123456789abcdef"]},
        {"extra_args": ["--api-key=0123456789abcdef"]},
    ],
)
def test_a_spec_refuses_a_bad_key_and_keys_from_elsewhere(fields):
    with pytest.raises(ValueError):
        make_spec(**fields)


@pytest.mark.security
def test_the_key_stays_out_of_the_specs_repr():
    key = "0123456789abcdef" * 2
    spec = make_spec(api_key=key)
    assert key not in repr(spec) and key not in str(spec)
    assert spec.model_dump()["api_key"] == key  # dispatched to the agent as part of the spec


def test_redact_argv_hides_every_value_of_a_multi_value_secret_flag():
    argv = ["--api-key", "k1", "k2", "--hf_token=zz", "--password", "p", "--port", "8000"]
    assert engine_argv.redact_argv(argv) == [
        *["--api-key", "***", "***", "--hf_token=***", "--password", "***", "--port", "8000"]
    ]


def test_token_count_and_tokenizer_flags_are_not_secrets():
    argv = ["--max-num-batched-tokens", "8192", "--tokenizer", "/m", "--hf-token", "t"]
    assert engine_argv.redact_argv(argv) == [*argv[:5], "***"]


def test_unredact_argv_round_trips_and_refuses_stars_with_nothing_stored():
    stored = ["--hf-token", "a=b", "--x", "redis://u:pw@h", "--api-key=k"]
    assert engine_argv.unredact_argv(engine_argv.redact_argv(stored), stored) == stored
    assert engine_argv.unredact_argv(["--hf-token", "new"], stored) == ["--hf-token", "new"]
    with pytest.raises(ValueError, match="--token"):
        engine_argv.unredact_argv(["--token", "***"], stored)
