"""Shared fixtures: real Redis (embedded or REDIS_URL), real Celery workers, users by role."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import client_for, make_user
from tests.kit import FakeEngine, Proc, child_env, on_free_port, wait_for


@pytest.fixture(scope="session", autouse=True)
def redis_url():
    """REDIS_URL when set (CI's real Redis), else an embedded Redis on a private unix socket."""
    from django.conf import settings

    from console import embedded_redis

    url = os.environ.get("REDIS_URL")
    proc = tmp = None
    if not url:
        tmp = Path(tempfile.mkdtemp(prefix="npc-redis-"))  # short path: unix sockets max 107 chars
        sock = tmp / "redis.sock"
        proc = embedded_redis.start(sock, tmp)
        url = f"unix://{sock}"
    broker = url.replace("unix://", "redis+socket://", 1)
    settings.REDIS_URL = url
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = broker
    from console.celery import app

    app.conf.broker_url = app.conf.result_backend = broker
    yield url
    if proc is not None:
        embedded_redis.stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def start_console_worker(redis_url: str, log: Path, **env: str) -> Proc:
    """Start a real console Celery worker (queues `console` and `console.jobs`: production
    runs one worker for each, see compose.yaml; the test database; `env` adds settings) and
    wait until it answers a ping."""
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "console",
        "worker",
        "-Q",
        "console,console.jobs",
        "-P",
        "solo",
        "-n",
        f"console-test-{os.getpid()}@%h",
        "-l",
        "info",
        "--without-gossip",
        "--without-mingle",
    ]
    proc = Proc(argv, child_env(redis_url, **env), log)
    from console.celery import app

    def answers():
        if proc.popen.poll() is not None:
            raise AssertionError(f"console worker exited:\n{proc.output()}")
        try:
            return app.send_task("console.ping", args=["ready"], queue="console").get(timeout=2)
        except Exception:  # noqa: BLE001 - not ready yet
            return None

    _wait_or_stop(proc, answers, "the console worker to answer")
    return proc


def _wait_or_stop(proc: Proc, ready, message: str) -> None:
    """Wait for a started process to be ready; stop it when it is not (no process outlives a
    failed fixture)."""
    try:
        wait_for(ready, 60, message=message)
    except BaseException:
        proc.stop()
        raise


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's set-up; at the end, on PostgreSQL, end any session still open on the
    test database (a thread or child process of some test that kept its connection) so that
    the database can be dropped — not a warning at the end of every PostgreSQL run."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def console_worker(redis_url, transactional_db, tmp_path):
    """A real console Celery worker process on queues `console` and `console.jobs`, sharing
    the test database."""
    proc = start_console_worker(redis_url, tmp_path / "console-worker.log")
    yield proc
    proc.stop()


@pytest.fixture
def console_web(redis_url, transactional_db, tmp_path):
    """The console's ASGI app (pages, /api/v1 and the /v1 gateway) served by a real uvicorn
    process on a free loopback port, sharing the test database. Yields its base URL."""
    import urllib.request

    def start(port: int) -> Proc:
        argv = [sys.executable, "-m", "uvicorn", "console.asgi:application"]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--lifespan", "on"]
        proc = Proc(argv, child_env(redis_url), tmp_path / f"console-web-{port}.log")
        proc.url = f"http://127.0.0.1:{port}"

        def up():
            if proc.popen.poll() is not None:
                raise AssertionError(f"console web exited:\n{proc.output()}")
            try:
                with urllib.request.urlopen(proc.url + "/login/", timeout=2) as resp:  # noqa: S310
                    return resp.status == 200
            except OSError:
                return False

        _wait_or_stop(proc, up, "the console web server to answer")
        return proc

    proc = on_free_port(start)  # another program may take the port before uvicorn binds it
    yield proc
    proc.stop()


@pytest.fixture
def fake_engine():
    """A running FakeEngine (tests/kit/fake_engine.py) with its default answers: 50 ms to
    the first token, 10 ms between tokens. Closed at teardown."""
    with FakeEngine() as engine:
        yield engine


# --- users ------------------------------------------------------------------------------------
@pytest.fixture
def viewer(db):
    return make_user("vera", "viewer")


@pytest.fixture
def operator(db):
    return make_user("otto", "operator")


@pytest.fixture
def admin_user(db):
    return make_user("ada", "admin")


@pytest.fixture
def viewer_client(viewer):
    return client_for(viewer)


@pytest.fixture
def operator_client(operator):
    return client_for(operator)


@pytest.fixture
def admin_client_(admin_user):
    return client_for(admin_user)


# --- browser (Playwright driving Debian's chromium; never `playwright install`) ----------------
def _in_a_browser(item: pytest.Item) -> bool:
    return item.get_closest_marker("browser") is not None or bool(
        {"browser", "page"} & set(getattr(item, "fixturenames", ()))
    )


# What a test that meets the database or the shared Redis asks for (directly or through
# another fixture: pytest lists the whole closure in item.fixturenames).
_BACKEND_FIXTURES = {
    "db",
    "transactional_db",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
    "live_server",
    "clean_redis",
}


def _meets_the_backend(item: pytest.Item) -> bool:
    """A test whose outcome can depend on PostgreSQL vs SQLite or TCP Redis vs the embedded
    one: it uses the database or the shared Redis, and is not a browser, engine or fault test
    (those run the same views and services, which the other tests cover on both)."""
    if any(item.get_closest_marker(m) for m in ("engine", "faults")) or _in_a_browser(item):
        return False
    names = set(getattr(item, "fixturenames", ()))
    return item.get_closest_marker("django_db") is not None or bool(_BACKEND_FIXTURES & names)


def pytest_itemcollected(item):
    """Marks `backend` the tests CI runs a second time on PostgreSQL + Redis (`.ci/run`: the
    whole suite runs on the embedded defaults first). Here, as each test is collected: `-m`
    selects on it later, and the order below is left to pytest_collection_modifyitems."""
    if _meets_the_backend(item):
        item.add_marker(pytest.mark.backend)


@pytest.hookimpl(trylast=True)  # after pytest-django's own ordering by database use
def pytest_collection_modifyitems(config, items):
    """Browser tests run last. Playwright's sync API keeps an event loop running in the main
    thread for the rest of the session once the browser starts, and tests that run an event
    loop of their own (asyncio.run, uvicorn in a thread) cannot start one after that."""
    items.sort(key=_in_a_browser)


# Session-wide and defined here once: a second sync_playwright() in the same process fails.
from tests.browser.conftest import ARGS as CHROMIUM_ARGS  # noqa: E402
from tests.browser.conftest import CHROMIUM  # noqa: E402


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("NPU_REQUIRE_BROWSER"):
            pytest.fail(f"chromium not found at {CHROMIUM} and NPU_REQUIRE_BROWSER is set")
        pytest.skip("chromium is not installed (apt install chromium); .ci/run installs it")
    # Playwright's sync API runs an event loop in this thread; the ORM calls made by fixtures
    # are still plain synchronous calls, so Django's async guard does not apply here.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()
