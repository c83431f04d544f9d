"""Promise: with DEBUG off and SECURE_COOKIES=1 (the production set-up behind TLS),
`manage.py check --deploy` reports nothing; without SECURE_COOKIES the console still serves
plain http (for `make run` on 127.0.0.1) with HttpOnly session cookies and framing denied."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.security

REPO = Path(__file__).resolve().parents[2]


def run_check(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    # DJANGO_ALLOW_ASYNC_UNSAFE is the test session's own (Playwright), never a deployment's
    drop = {"DEBUG", "SECURE_COOKIES", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="console.example.com",
        NPU_CONSOLE_VAR_DIR=str(tmp_path),
        **extra,
    )
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_in_production_settings(tmp_path):
    done = run_check(tmp_path, SECURE_COOKIES="1", SECURE_PROXY_SSL_HEADER="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout, done.stdout + done.stderr


def test_check_deploy_flags_plain_http(tmp_path):
    """The check is real: without the HTTPS settings it reports the insecure cookies."""
    done = run_check(tmp_path)
    assert done.returncode != 0
    for code in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert code in done.stdout + done.stderr, code


def test_production_settings_values(tmp_path):
    code = (
        "from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SESSION_COOKIE_HTTPONLY, "
        "s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, "
        "s.X_FRAME_OPTIONS, s.SECURE_CONTENT_TYPE_NOSNIFF, s.SECURE_PROXY_SSL_HEADER)"
    )
    env = dict(
        os.environ,
        DEBUG="0",
        SECURE_COOKIES="1",
        NPU_CONSOLE_VAR_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="console.settings",
    )
    env.pop("SECURE_PROXY_SSL_HEADER", None)
    done = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # X-Forwarded-Proto is not trusted unless SECURE_PROXY_SSL_HEADER=1 says a proxy sets it
    assert done.stdout.split() == ["True"] * 4 + ["3600", "True", "DENY", "True", "None"]


def test_plain_http_locally_keeps_httponly_session_and_security_headers(admin_client_):
    resp = admin_client_.get("/")
    assert resp.status_code == 200
    assert resp["X-Frame-Options"] == "DENY"
    assert resp["X-Content-Type-Options"] == "nosniff"
    assert resp["Referrer-Policy"] == "same-origin"
    from django.conf import settings

    assert settings.SESSION_COOKIE_HTTPONLY is True
    assert settings.SECURE_PROXY_SSL_HEADER is None
    resp = admin_client_.get("/", HTTP_X_FORWARDED_PROTO="https")
    assert not resp.wsgi_request.is_secure()  # a client cannot claim HTTPS by header
