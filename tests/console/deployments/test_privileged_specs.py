"""What an operator can make a host do (docs/security.md): flags, variables and settings that
load code, read host files into what an engine serves, write files or open doors need the
admin role (workers/engine_settings.py PRIVILEGED_FLAGS / PRIVILEGED_ENV / admin_only rows),
enforced in the one intake (services.check_spec) for the API, the form and the catalog."""

from __future__ import annotations

import shlex

import pytest

from console.deployments import catalog
from console.deployments import validation as v
from console.deployments.models import Deployment
from tests.factories import make_node
from workers import engine_settings as es

pytestmark = pytest.mark.security

BASE = {
    "name": "r1-7b",
    "model_path": "/models/DeepSeek-R1-Distill-Qwen-7B",
    "served_model_name": "r1-7b",
    "tensor_parallel_size": 1,
    "npus_per_replica": 1,
    "max_model_len": 8192,
}
URL = "/api/v1/deployments"

# Each: what an operator sends -> the field the 422 names.
REFUSED = [
    ({"extra_args": ["--tool-parser-plugin", "/tmp/p.py"]}, "extra_args.0"),
    ({"extra_args": ["--seed", "1", "--reasoning-parser-plugin=/tmp/r.py"]}, "extra_args.2"),
    ({"extra_args": ["--logits-processors", "evil.Processor"]}, "extra_args.0"),
    ({"extra_args": ["--middleware", "evil.app"]}, "extra_args.0"),
    ({"extra_args": ["--worker-extension-cls", "evil.Ext"]}, "extra_args.0"),
    ({"extra_args": ["--model-class-overrides", '{"X": "evil:Model"}']}, "extra_args.0"),
    ({"extra_args": ["--chat-template", "/etc/shadow"]}, "extra_args.0"),
    ({"extra_args": ["--chat-template=../../etc/shadow"]}, "extra_args.0"),
    ({"extra_args": ["--allowed-local-media-path", "/"]}, "extra_args.0"),
    ({"extra_args": ["--config", "/etc/vllm.yaml"]}, "extra_args.0"),
    ({"extra_args": ["--logging-config", '{"pylogging_config_file": "/x.json"}']}, "extra_args.0"),
    ({"extra_args": ["--compilation-config", '{"debug_dump_path": "/tmp/d"}']}, "extra_args.0"),
    ({"extra_args": ["--compilation-config", '{"backend": "evil.compile"}']}, "extra_args.0"),
    ({"extra_args": ["--additional-config", '{"a": {"expert_map_path": "/x"}}']}, "extra_args.0"),
    ({"extra_args": ["--kv-transfer-config", '{"kv_connector": "X"}']}, "extra_args.0"),
    ({"extra_args": ["--tool-server", "demo"]}, "extra_args.0"),
    ({"extra_args": ["--download-dir", "/etc"]}, "extra_args.0"),
    ({"extra_env": {"VLLM_SERVER_DEV_MODE": "1"}}, "extra_env.VLLM_SERVER_DEV_MODE"),
    ({"extra_env": {"VLLM_PLUGINS": "evil"}}, "extra_env.VLLM_PLUGINS"),
    (
        {"extra_env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}},
        "extra_env.VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    ),
    ({"extra_env": {"VLLM_LOGGING_CONFIG_PATH": "/x"}}, "extra_env.VLLM_LOGGING_CONFIG_PATH"),
    ({"extra_env": {"ASCEND_CUSTOM_OPP_PATH": "/x"}}, "extra_env.ASCEND_CUSTOM_OPP_PATH"),
    ({"extra_env": {"HF_MODULES_CACHE": "/x"}}, "extra_env.HF_MODULES_CACHE"),
    ({"trust_remote_code": True}, "trust_remote_code"),
]


def post(client, **overrides):
    return client.post(URL, {**BASE, **overrides}, content_type="application/json")


def put(client, **overrides):
    return client.put(
        f"{URL}/{BASE['name']}", {**BASE, **overrides}, content_type="application/json"
    )


@pytest.fixture
def node(db):
    return make_node("kp-01", npus=8)


@pytest.mark.parametrize(("overrides", "field"), REFUSED)
def test_an_operator_is_refused_what_runs_code_or_reads_host_files(
    operator_client, node, fake_inspect, overrides, field
):
    resp = post(operator_client, **overrides)
    assert resp.status_code == 422, resp.content
    body = resp.json()
    assert body["field"] == field and "needs the admin role" in body["message"], body
    assert not Deployment.objects.exists()


@pytest.mark.parametrize(("overrides", "field"), REFUSED)
def test_an_admin_may_give_them(admin_client_, node, fake_inspect, overrides, field):
    resp = post(admin_client_, **overrides)
    assert resp.status_code == 201, resp.content


def test_an_operator_keeps_the_safe_forms_of_the_same_flags(operator_client, node, fake_inspect):
    """An inline chat template, a JSON config naming no path or module, tuning variables."""
    resp = post(
        operator_client,
        extra_args=[
            "--chat-template",
            "{% for m in messages %}{{ m.content }}</s>{% endfor %}",
            "--additional-config",
            '{"ascend_compilation_config": {"enable_npugraph_ex": false}}',
            "--reasoning-parser",
            "deepseek_r1",
            "--distributed-executor-backend",
            "mp",
        ],
        extra_env={"HCCL_OP_EXPANSION_MODE": "AIV", "VLLM_DISABLE_COMPILE_CACHE": "1"},
    )
    assert resp.status_code == 201, resp.content


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "HF_HUB_OFFLINE"]
)
def test_loader_variables_and_the_offline_switches_are_refused_to_everyone(
    admin_client_, node, fake_inspect, name
):
    """No role sets these: LD_PRELOAD only through the allocator setting."""
    resp = post(admin_client_, extra_env={name: "0"})
    assert resp.status_code == 422 and resp.json()["field"] == f"extra_env.{name}"


def test_transformers_offline_cannot_be_turned_off(admin_client_, node, fake_inspect):
    resp = post(admin_client_, extra_env={"TRANSFORMERS_OFFLINE": "0"})
    assert resp.status_code == 422 and "managed by the agent" in resp.json()["message"]


def test_the_allow_lists_let_operators_use_named_flags_and_variables(
    operator_client, node, fake_inspect, settings
):
    settings.NPU_OPERATOR_ALLOWED_FLAGS = ["--chat-template"]
    settings.NPU_OPERATOR_ALLOWED_ENV = ["VLLM_PLUGINS"]
    resp = post(
        operator_client,
        extra_args=["--chat-template", "/opt/templates/chatml.jinja"],
        extra_env={"VLLM_PLUGINS": "lora_filesystem_resolver"},
    )
    assert resp.status_code == 201, resp.content
    refused = post(operator_client, name="other", extra_args=["--middleware", "x.y"])
    assert refused.status_code == 422 and refused.json()["field"] == "extra_args.0"


# --- updates: an admin's privileged settings are kept as they are, never added or changed ---


@pytest.fixture
def admins_deployment(admin_client_, node, fake_inspect):
    resp = post(
        admin_client_,
        trust_remote_code=True,
        extra_args=["--chat-template", "/opt/templates/r1.jinja", "--seed", "1"],
        extra_env={"VLLM_PLUGINS": "ascend_tools"},
    )
    assert resp.status_code == 201, resp.content
    return resp.json()


ADMINS = {
    "trust_remote_code": True,
    "extra_args": ["--chat-template", "/opt/templates/r1.jinja", "--seed", "1"],
    "extra_env": {"VLLM_PLUGINS": "ascend_tools"},
}


def test_an_operator_may_change_other_fields_of_an_admins_deployment(
    operator_client, admins_deployment
):
    resp = put(operator_client, **ADMINS, max_model_len=4096)
    assert resp.status_code == 200, resp.content
    assert Deployment.objects.get().max_model_len == 4096
    changed = {
        **ADMINS,
        "extra_args": ["--chat-template", "/opt/templates/r1.jinja", "--seed", "2"],
    }
    assert put(operator_client, **changed).status_code == 200  # --seed is anyone's


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"extra_args": ["--chat-template", "/etc/shadow", "--seed", "1"]}, "extra_args.0"),
        ({"extra_env": {"VLLM_PLUGINS": "other"}}, "extra_env.VLLM_PLUGINS"),
        (
            {"extra_env": {"VLLM_PLUGINS": "ascend_tools", "VLLM_SERVER_DEV_MODE": "1"}},
            "extra_env.VLLM_SERVER_DEV_MODE",
        ),
        ({"model_path": "/models/other"}, "model_path"),  # trust_remote_code on another model
    ],
)
def test_an_operator_may_not_change_or_add_to_an_admins_privileged_part(
    operator_client, admins_deployment, change, field
):
    resp = put(operator_client, **{**ADMINS, **change})
    assert resp.status_code == 422, resp.content
    assert resp.json()["field"] == field
    assert Deployment.objects.get().extra_args == ADMINS["extra_args"]


def test_an_operator_may_remove_an_admins_privileged_part(operator_client, admins_deployment):
    resp = put(operator_client, model_path="/models/other")
    assert resp.status_code == 200, resp.content
    dep = Deployment.objects.get()
    assert not dep.trust_remote_code and dep.extra_args == [] and dep.extra_env == {}


def test_an_admin_may_change_it(admin_client_, admins_deployment):
    resp = put(admin_client_, **{**ADMINS, "extra_args": ["--chat-template", "/opt/t2.jinja"]})
    assert resp.status_code == 200, resp.content


# --- the form and the catalog go through the same intake ---


FORM = {
    "name": "r1-7b",
    "model_path": "/models/r1-7b",
    "served_model_name": "r1-7b",
    "device": "npu",
    "tensor_parallel_size": "1",
    "pipeline_parallel_size": "1",
    "npus_per_replica": "1",
    "gpu_memory_utilization": "0.9",
    "replicas": "1",
    "dtype": "auto",
    "quantization": "",
    "max_model_len": "8192",
}


def test_the_form_and_its_live_check_refuse_an_operator_the_same(
    operator_client, admin_client_, node, fake_inspect
):
    form = {**FORM, "extra_args": shlex.join(["--tool-parser-plugin", "/tmp/p.py"])}
    resp = operator_client.post("/deployments/new", form)
    assert resp.status_code == 422 and "needs the admin role" in resp.content.decode()
    live = operator_client.post("/deployments/validate", form, HTTP_HX_REQUEST="true")
    assert "needs the admin role" in live.content.decode()
    checked = operator_client.post("/deployments/validate", {**FORM, "trust_remote_code": "on"})
    assert "--trust-remote-code needs the admin role" in checked.content.decode()
    assert not Deployment.objects.exists()
    admins_live = admin_client_.post("/deployments/validate", form, HTTP_HX_REQUEST="true")
    assert "needs the admin role" not in admins_live.content.decode()


def test_no_catalog_preset_needs_the_admin_role():
    """Presets reach the operator's form (catalog_views): none may carry a privileged flag."""
    for model in catalog.load_catalog().models.values():
        for card_id in model.presets:
            card = catalog.get_card(card_id)
            if not model.presets[card_id].fits:
                continue
            spec = catalog.preset_spec(model, card)
            assert v.privileges(spec) == [], (model.id, card_id)


# --- the table itself ---


def test_every_privileged_flag_is_a_real_vllm_flag():
    """The classification names vLLM's own flags (a typo would let the real one through)."""
    assert set(es.PRIVILEGED_FLAGS) <= v.known_flags()


def test_flag_values_reads_both_spellings():
    args = ["--seed", "1", "--chat-template=/x", "--enforce-eager", "--dtype", "auto"]
    assert list(v.flag_values(args)) == [
        (0, "--seed", "1"),
        (2, "--chat-template", "/x"),
        (3, "--enforce-eager", None),
        (4, "--dtype", "auto"),
    ]


def test_the_access_log_filter_is_the_agents(operator_client, node, fake_inspect):
    """The agent sets --disable-access-log-for-endpoints (its own probes' lines): a spec's
    would replace it (argparse keeps the last value)."""
    resp = post(operator_client, extra_args=["--disable-access-log-for-endpoints", "/v1/x"])
    assert resp.status_code == 422 and resp.json()["field"] == "extra_args.0"
    assert "the agent sets it" in resp.json()["message"]


def test_an_operator_may_choose_the_allocator(operator_client, node, fake_inspect):
    resp = post(operator_client, allocator="jemalloc")
    assert resp.status_code == 201 and resp.json()["allocator"] == "jemalloc"
    wrong = post(operator_client, name="other", allocator="/tmp/evil.so")
    assert wrong.status_code == 422 and wrong.json()["field"] == "allocator"
