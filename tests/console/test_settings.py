"""Settings come from the environment; a malformed value stops start-up with one clear line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.kit import REPO


def run_check(**env_overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}}
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "name, value",
    [
        ("DATABASE_URL", "postgres://u@db:notaport/x"),
        ("DATABASE_URL", "mysql//nope"),
        ("REDIS_URL", "http://redis:6379"),
        ("REDIS_URL", "redis://:6379/0"),
        ("DEBUG", "perhaps"),
    ],
)
def test_malformed_variable_fails_with_one_line_naming_it(name, value):
    result = run_check(**{name: value})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"configuration error: {name}")


def test_defaults_are_sqlite_under_var_and_embedded_redis(settings):
    from django.conf import settings as live

    assert live.DEBUG is False or os.environ.get("DEBUG")
    if not os.environ.get("DATABASE_URL"):
        assert live.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    if not os.environ.get("REDIS_URL"):
        assert live.EMBEDDED_REDIS


def test_secret_key_is_generated_once_into_var(tmp_path):
    from console.env import secret_key

    os.environ.pop("SECRET_KEY", None)
    first = secret_key(tmp_path)
    assert secret_key(tmp_path) == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
