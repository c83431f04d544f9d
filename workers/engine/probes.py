"""Probes of a running engine over HTTP and TCP (standard library only, short timeouts).

Every probe answers; none raises for a refused connection, a timeout or a bad answer.
Proxies are never used (an HTTP_PROXY in the agent's environment must not route 127.0.0.1).
`api_key`: the replica's engine key (EngineSpec.api_key), sent as `Authorization: Bearer` —
vLLM refuses /v1/* without it (see argv.build_env) — and never put in a detail or a log.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

from workers.engine.prometheus import parse_vllm_metrics

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_MAX_BODY = 8 * 1024 * 1024


def probe_address(host: str) -> str:
    """Where to connect to reach an engine bound to `host` (a wildcard means loopback)."""
    if host in ("", "0.0.0.0"):  # noqa: S104 - mapping the wildcard, not binding to it
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host


def _url(host: str, port: int, path: str) -> str:
    address = probe_address(host)
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"http://{address}:{port}{path}"


def http_get(
    host: str, port: int, path: str, timeout: float, api_key: str | None = None
) -> tuple[int | None, bytes, str]:
    """(status, body, detail); status None when no HTTP answer came (detail says why)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        request = urllib.request.Request(_url(host, port, path), headers=headers)  # noqa: S310 - http:// built here
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read(_MAX_BODY), f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return exc.code, b"", f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, b"", f"no answer: {reason}"


def port_accepts(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a TCP connection to the port succeeds."""
    try:
        with socket.create_connection((probe_address(host), port), timeout=timeout):
            return True
    except OSError:
        return False


def probe_health(
    host: str, port: int, timeout: float = 2.0, api_key: str | None = None
) -> tuple[bool, str]:
    """(ok, detail): ok when GET /health answers 200."""
    status, _body, detail = http_get(host, port, "/health", timeout, api_key)
    return status == 200, f"/health: {detail}"


def probe_models(
    host: str, port: int, served_name: str, timeout: float = 2.0, api_key: str | None = None
) -> tuple[bool, str]:
    """(ok, detail): ok when GET /v1/models answers 200 and lists `served_name`."""
    status, body, detail = http_get(host, port, "/v1/models", timeout, api_key)
    if status != 200:
        return False, f"/v1/models: {detail}"
    try:
        ids = [m.get("id") for m in json.loads(body).get("data", [])]
    except (ValueError, AttributeError, TypeError):
        return False, "/v1/models: not the OpenAI list format"
    if served_name in ids:
        return True, f"/v1/models lists {served_name}"
    return False, f"/v1/models does not list {served_name} (lists {', '.join(map(str, ids))})"


def scrape_metrics(
    host: str, port: int, timeout: float = 2.0, api_key: str | None = None
) -> dict[str, float]:
    """vLLM's /metrics summarised (see prometheus.vllm_summary); {} when it does not answer."""
    status, body, _detail = http_get(host, port, "/metrics", timeout, api_key)
    if status != 200:
        return {}
    return parse_vllm_metrics(body.decode("utf-8", errors="replace"))
