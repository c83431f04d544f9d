"""Replica.base_url (the gateway's upstream, built from parsed parts only) and the engine key."""

from __future__ import annotations

import pytest
from django.test import override_settings

from console.deployments.models import Deployment, Replica, engine_api_key, engine_url
from tests.factories import make_node

pytestmark = pytest.mark.security


def test_engine_key_is_derived_the_same_way_everywhere_and_differs_per_replica():
    key = engine_api_key(7)
    assert key == engine_api_key(7) != engine_api_key(8)
    assert len(key) == 64 and key.isalnum()  # fits EngineSpec.api_key's [A-Za-z0-9_-]{16,128}
    with override_settings(SECRET_KEY="another-secret-" * 4):
        assert engine_api_key(7) != key  # from SECRET_KEY: not guessable from the id


@pytest.mark.parametrize(
    ("address", "port", "url"),
    [
        ("10.0.0.5", 8100, "http://10.0.0.5:8100"),
        (" 10.0.0.5 ", 8100, "http://10.0.0.5:8100"),
        ("fd00::5", 8100, "http://[fd00::5]:8100"),
        ("[fd00:0:0::5]", 8100, "http://[fd00::5]:8100"),
        ("127.0.0.1", 65535, "http://127.0.0.1:65535"),
        ("127.0.0.1:9/evil?x=", 8100, None),
        ("10.0.0.5#", 8100, None),
        ("npu-1.example", 8100, None),
        ("", 8100, None),
        ("0.0.0.0", 8100, None),
        ("::", 8100, None),
        ("fe80::1%eth0", 8100, None),
        ("224.0.0.1", 8100, None),
        ("10.0.0.5", 1023, None),
        ("10.0.0.5", 65536, None),
        ("10.0.0.5", None, None),
        ("10.0.0.5", True, None),
        ("10.0.0.5", "8100", None),
    ],
)
def test_engine_url_takes_an_ip_address_and_an_engine_port_only(address, port, url):
    assert engine_url(address, port) == url


def _replica(device: str, address: str, port: int = 8123) -> Replica:
    node = make_node(address=address, hostname="evil.example")
    dep = Deployment.objects.create(
        name=f"d-{node.pk}", model_path="/models/m", served_model_name="m", device=device
    )
    return Replica.objects.create(deployment=dep, index=0, node=node, port=port)


def test_npu_replica_url_is_its_nodes_address_never_its_hostname(db):
    assert _replica("npu", "10.1.2.3").base_url == "http://10.1.2.3:8123"
    assert _replica("npu", "").base_url is None  # no fallback to evil.example


def test_a_node_reporting_a_url_in_its_address_gets_no_upstream(db):
    assert _replica("npu", "127.0.0.1:9/evil?x=").base_url is None


def test_cpu_replicas_stay_on_loopback(db):
    assert _replica("cpu", "127.0.0.1:9/evil?x=").base_url == "http://127.0.0.1:8123"
