"""Set-up shared by the benches that run the whole console for real (limits_two_processes.py,
rolling_update.py): a scratch SQLite database and an embedded Redis (or REDIS_URL), Django on
them, an admin with API tokens, and console web processes (console.asgi under uvicorn) on
free loopback ports, every one sharing that database and that Redis.

Call `scratch_django(prefix)` before anything imports Django or the console; then use
`console_stack(scratch)` around the bench. Not a bench itself (the leading underscore).
BENCH_KEEP=1 keeps the scratch directory (the processes' logs) after the run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINE_PY = Path(os.environ.get("NPU_ENGINE_PYTHON", REPO / ".venv-engine" / "bin" / "python"))
_EMBEDDED_REDIS = not os.environ.get("REDIS_URL")  # as the first import found it


def scratch_django(prefix: str) -> Path:
    """A fresh scratch directory, DATABASE_URL (SQLite there) and REDIS_URL (an embedded
    Redis's socket there, unless REDIS_URL is set) in the environment, so that Django here
    and every process started later (uvicorn, Celery, the agent) share them; then
    django.setup(). Returns the scratch directory."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))  # short: unix sockets take 107 chars
    os.environ["DATABASE_URL"] = f"sqlite:///{scratch / 'bench.sqlite3'}"
    if _EMBEDDED_REDIS:
        os.environ["REDIS_URL"] = f"unix://{scratch / 'redis.sock'}"
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    return scratch


def require_engine_python() -> Path:
    """The engine venv's python, or exit saying how to make it."""
    if not ENGINE_PY.exists():
        sys.exit(f"no engine python at {ENGINE_PY}: run `make engine-env` first")
    return ENGINE_PY


@dataclass
class Stack:
    """What console_stack started: the scratch directory, the Redis URL, the admin user and
    the processes to stop at the end (add yours to `procs`)."""

    scratch: Path
    redis_url: str
    admin: object
    procs: list = field(default_factory=list)

    def token(self, name: str) -> tuple[int, str]:
        """A new API token of the admin: (its id, the raw value)."""
        from console.accounts.services import create_token

        row, raw = create_token(actor=self.actor(), name=name)
        return row.pk, raw

    def actor(self):
        from console.accounts.services import Actor

        return Actor(user=self.admin, name="bench")

    def console(self) -> str:
        """One more console web process (uvicorn, console.asgi) on a free port, sharing the
        database and Redis; returns its base URL once it answers."""
        from tests.kit import Proc, child_env, on_free_port, wait_for

        def start(port: int) -> Proc:
            argv = [sys.executable, "-m", "uvicorn", "console.asgi:application"]
            argv += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
            argv += ["--lifespan", "on", "--log-level", "warning"]
            log = self.scratch / f"console-web-{port}.log"
            proc = Proc(argv, child_env(self.redis_url), log)
            self.procs.append(proc)
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: _answers(proc, url), 60, message=f"the console on port {port}")
            proc.url = url
            return proc

        return on_free_port(start).url


def _answers(proc, url: str) -> bool:
    if proc.popen.poll() is not None:
        raise AssertionError(f"the console exited:\n{proc.output()[-4000:]}")
    try:
        with urllib.request.urlopen(url + "/login/", timeout=2) as resp:  # noqa: S310 - loopback
            return resp.status == 200
    except OSError:
        return False


@contextmanager
def console_stack(scratch: Path) -> Iterator[Stack]:
    """Redis up (embedded unless REDIS_URL was given), the schema migrated, an admin user;
    at exit every process in `procs` is stopped (last started first), Redis too, and the
    scratch directory removed."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from console import embedded_redis

    redis_proc = None
    if _EMBEDDED_REDIS:
        redis_proc = embedded_redis.start(scratch / "redis.sock", scratch)
    stack = None
    try:
        call_command("migrate", verbosity=0)
        admin = get_user_model().objects.create_superuser("bench", password="bench-pw-123")
        stack = Stack(scratch, settings.REDIS_URL, admin)
        yield stack
    finally:
        for proc in reversed(stack.procs if stack else []):
            proc.stop()
        if redis_proc is not None:
            embedded_redis.stop(redis_proc)
        if os.environ.get("BENCH_KEEP") == "1":
            print(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
