"""The TLS proxy of compose.yaml, run for real: deploy/nginx/nginx.conf in front of a real
uvicorn started with compose's flags and settings, and in front of Redis for the agents.

The config is the project's own file with only what Docker provides rewritten: the service
names become loopback addresses (or the test Redis's unix socket), the published ports free
ports, the certificate paths a throw-away self-signed pair. Debian's nginx loads the stream
module from a file; the nginx image compose uses has it built in.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import ssl
import subprocess
import sys
import urllib.parse
from pathlib import Path

import httpx
import pytest
import redis

from console.accounts.models import AuditEntry
from tests.helpers import make_user
from tests.kit import REPO, Proc, child_env, free_port, wait_for

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")

pytestmark = pytest.mark.skipif(
    not Path(NGINX).exists() and not os.environ.get("NPU_REQUIRE_NGINX"),
    reason="nginx is not installed (apt install nginx libnginx-mod-stream); .ci/run installs it",
)


def self_signed(tls: Path) -> Path:
    tls.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
        + ["-keyout", str(tls / "privkey.pem"), "-out", str(tls / "fullchain.pem")],
        check=True,
        capture_output=True,
    )
    return tls / "fullchain.pem"


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def rewritten_config(tmp: Path, *, web: str, broker: str, ports: dict[str, int]) -> Path:
    conf = (REPO / "deploy/nginx/nginx.conf").read_text()
    subs = [
        (r"server web:8000;", f"server {web};"),
        (r"server redis:6379;", f"server {broker};"),
        (r"listen 80;", f"listen 127.0.0.1:{ports['http']};"),
        (r"listen 443 ssl;", f"listen 127.0.0.1:{ports['https']} ssl;"),
        (r"listen 6380 ssl;", f"listen 127.0.0.1:{ports['broker']} ssl;"),
        (r"/etc/nginx/tls/", f"{tmp / 'tls'}/"),
        (r"access_log /dev/stdout;", f"access_log {tmp / 'access.log'};"),
        (r"error_log /dev/stderr warn;", f"error_log {tmp / 'error.log'} warn;"),
    ]
    for pattern, repl in subs:
        conf, n = re.subn(re.escape(pattern), repl, conf)
        assert n, f"deploy/nginx/nginx.conf no longer has {pattern!r}"
    conf = re.sub(r"^\s*listen \[::\].*$", "", conf, flags=re.M)  # loopback IPv4 only here
    conf = conf.replace("worker_processes auto;", "worker_processes 1;")
    head = f"load_module {STREAM_MODULE};\n" if STREAM_MODULE.exists() else ""
    head += f"pid {tmp / 'nginx.pid'};\nerror_log {tmp / 'main-error.log'} info;\n"
    if os.geteuid() == 0:  # workers as this user: the test Redis's socket is in a 0700 dir
        head += f"user {getpass.getuser()};\n"
    path = tmp / "nginx.conf"
    path.write_text(head + conf)
    return path


@pytest.fixture
def proxy(redis_url, transactional_db, tmp_path):
    """nginx (deploy/nginx/nginx.conf) -> uvicorn as compose runs it -> the test database."""
    ca = self_signed(tmp_path / "tls")
    web_port = free_port()
    env = child_env(redis_url, SECURE_PROXY_SSL_HEADER="1", SECURE_COOKIES="1")
    argv = [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1"]
    argv += ["--port", str(web_port), "--proxy-headers", "--forwarded-allow-ips", "*"]
    web = Proc(argv, env, tmp_path / "web.log")
    parsed = urllib.parse.urlsplit(redis_url)
    broker = f"unix:{parsed.path}" if parsed.scheme == "unix" else parsed.netloc.split("@")[-1]
    ports = {"http": free_port(), "https": free_port(), "broker": free_port()}
    conf = rewritten_config(tmp_path, web=f"127.0.0.1:{web_port}", broker=broker, ports=ports)
    test = subprocess.run([NGINX, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True)
    assert test.returncode == 0, test.stderr.decode()
    nginx = Proc(
        [NGINX, "-c", str(conf), "-p", str(tmp_path), "-g", "daemon off;"],
        os.environ.copy(),
        tmp_path / "nginx.out",
    )
    base = f"https://localhost:{ports['https']}"

    def up() -> bool:
        for proc in (web, nginx):
            assert proc.popen.poll() is None, proc.output()
        try:
            return httpx.get(base + "/login/", verify=trusting(ca), timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 60, message="the console behind nginx")
        yield {"base": base, "ca": ca, "ports": ports, "tmp": tmp_path}
    finally:
        nginx.stop()
        web.stop()


def test_plain_http_is_redirected_to_https(proxy):
    port = proxy["ports"]["http"]
    resp = httpx.get(f"http://127.0.0.1:{port}/nodes/?status=online", follow_redirects=False)
    assert resp.status_code == 301
    assert resp.headers["location"] == "https://127.0.0.1/nodes/?status=online"


def test_sign_in_and_a_form_post_work_over_https_and_the_client_cannot_spoof_its_address(
    proxy,
):
    make_user("pat", "viewer")
    spoof = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "http"}
    with httpx.Client(base_url=proxy["base"], verify=trusting(proxy["ca"]), headers=spoof) as http:
        login = http.get("/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
        assert "secure" in login.headers["set-cookie"].lower()  # SECURE_COOKIES behind TLS
        resp = http.post(
            "/login/",
            data={"username": "pat", "password": "pw-pat-123"} | {"csrfmiddlewaretoken": csrf},
            headers={"Referer": proxy["base"] + "/login/"},
        )
        # Django saw https (X-Forwarded-Proto from nginx, not the client's "http"): the
        # CSRF origin check passed and the session cookie is Secure
        assert resp.status_code == 302, resp.text[:500]
        assert "secure" in resp.headers["set-cookie"].lower()
        assert resp.headers["strict-transport-security"].startswith("max-age=")
        page = http.get("/tokens/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        made = http.post(
            "/tokens/new",
            data={"name": "behind-proxy", "scope": "read", "csrfmiddlewaretoken": csrf},
            headers={"Referer": proxy["base"] + "/tokens/"},
        )
        assert made.status_code == 302
    entry = AuditEntry.objects.get(action="token.create")
    assert entry.remote_addr == "127.0.0.1"  # nginx's $remote_addr, not the client's claim


def test_the_gateway_answers_through_the_proxy(proxy):
    resp = httpx.get(proxy["base"] + "/v1/models", verify=trusting(proxy["ca"]))
    assert resp.status_code == 401
    assert resp.json()["error"]["type"]


def test_agents_reach_the_broker_over_tls_only(proxy):
    port = proxy["ports"]["broker"]
    tls = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(proxy["ca"]))
    try:
        assert tls.ping() is True
    except redis.RedisError as exc:
        raise AssertionError((proxy["tmp"] / "main-error.log").read_text()) from exc
    plain = redis.Redis(host="127.0.0.1", port=port, socket_timeout=3)
    with pytest.raises(redis.RedisError):
        plain.ping()
