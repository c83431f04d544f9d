"""compose.yaml, the Dockerfile, the TLS proxy and the agent's systemd unit, checked without Docker.

Every command a container of this project's image runs must name something that exists here:
a management command, an ASGI application, a Celery app and subcommand, an agent subcommand.
The promises of docs/operations.md about the production shape are checked here too: Redis needs
a password and the console's REDIS_URL carries it, Redis and PostgreSQL are never published,
the TLS proxy points at the web service and at Redis, the console's settings under compose pass
`check --deploy`, and the agent's unit verifies and names only settings the agent reads.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
NGINX_CONF = ROOT / "deploy" / "nginx" / "nginx.conf"
UNIT = ROOT / "deploy" / "systemd" / "npu-agent.service"
AGENT_ENV_EXAMPLE = ROOT / "deploy" / "systemd" / "npu-agent.env.example"
COMPOSE_ENV_EXAMPLE = ROOT / "deploy" / "compose.env.example"

PYTHONS = {"python", "python3", "python3.11"}
# The services that run the console (they share x-console-env).
CONSOLE_SERVICES = ("migrate", "web", "worker", "jobs-worker", "beat")
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


# --- turning a command into the argv lists it runs ------------------------------------------


def _unescape(text: str) -> str:
    return text.replace("$$", "$")  # compose's escape for a literal dollar


def _split_script(script: str) -> list[list[str]]:
    """A shell script cut at &&, ||, ;, |, & and newlines into simple commands."""
    parts: list[list[str]] = []
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        parts.append([])
        for token in lexer:
            if set(token) <= set(";&|"):  # &&, ||, ;, |, & (and runs of them)
                parts.append([])
            else:
                parts[-1].append(token)
    return [part for part in parts if part]


def command_argvs(command: str | list[str]) -> list[list[str]]:
    """The simple commands a compose `command:` (string or list) runs, shell forms split up."""
    argv = shlex.split(_unescape(command)) if isinstance(command, str) else list(command)
    argv = [_unescape(str(arg)) for arg in argv]
    if argv and argv[0] in SHELLS:
        if len(argv) < 3 or not re.fullmatch(r"-[a-z]*c", argv[1]):
            return [argv]  # not `sh -c SCRIPT`: left as is, so the checker rejects it
        return [_strip_prefixes(part) for part in _split_script(argv[2])]
    return [_strip_prefixes(argv)]


def _strip_prefixes(argv: list[str]) -> list[str]:
    """Drop leading `exec` and VAR=value assignments."""
    while argv and (argv[0] == "exec" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0])):
        argv = argv[1:]
    return argv


# --- checking one argv -----------------------------------------------------------------------


def _click_unknown_options(command, args: list[str]) -> list[str]:
    """Options in args that the click command does not declare (values are not checked)."""
    known = set()
    for param in command.params:
        known.update(getattr(param, "opts", []))
        known.update(getattr(param, "secondary_opts", []))
    return [a for a in args if a.startswith("-") and a.split("=", 1)[0] not in known]


def _check_manage_py(args: list[str]) -> list[str]:
    from django.core.management import get_commands, load_command_class
    from django.core.management.base import CommandError

    if not args:
        return ["manage.py without a command"]
    name, rest = args[0], args[1:]
    commands = get_commands()
    if name not in commands:
        return [f"manage.py: no management command {name!r}"]
    parser = load_command_class(commands[name], name).create_parser("manage.py", name)
    try:
        parser.parse_args(rest)
    except (CommandError, SystemExit) as exc:
        return [f"manage.py {name}: bad arguments {rest}: {exc}"]
    return []


def _check_workers_main(args: list[str]) -> list[str]:
    try:
        main = importlib.import_module("workers.__main__")
    except ImportError as exc:
        return [f"python -m workers: cannot import workers.__main__: {exc}"]
    if not hasattr(main, "build_parser"):
        return ["python -m workers: workers.__main__ has no build_parser()"]
    parser = main.build_parser()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    choices = {name: sub for action in subparsers for name, sub in action.choices.items()}
    if not args:
        return ["python -m workers without a subcommand"]
    name, rest = args[0], args[1:]
    if name not in choices:
        return [f"python -m workers: no subcommand {name!r} (has {sorted(choices)})"]
    try:
        choices[name].parse_args(rest)
    except SystemExit:
        return [f"python -m workers {name}: bad arguments {rest}"]
    return []


def _check_python(args: list[str]) -> list[str]:
    if args[:1] == ["manage.py"]:
        if not (ROOT / "manage.py").is_file():
            return ["manage.py does not exist"]
        return _check_manage_py(args[1:])
    if args[:2] == ["-m", "workers"]:
        return _check_workers_main(args[2:])
    return [f"python {' '.join(args)}: not a known entry point of this project"]


def _check_uvicorn(args: list[str]) -> list[str]:
    uvicorn_cli = importlib.import_module("uvicorn.main").main  # `uvicorn.main` is the function

    targets = [a for a in args if not a.startswith("-") and ":" in a]
    if not targets:
        return ["uvicorn without module:attribute"]
    module_name, _, attr = targets[0].partition(":")
    problems = [f"uvicorn: unknown option {o}" for o in _click_unknown_options(uvicorn_cli, args)]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return [*problems, f"uvicorn: cannot import {module_name!r}: {exc}"]
    if not hasattr(module, attr):
        problems.append(f"uvicorn: {module_name} has no attribute {attr!r}")
    return problems


def _check_celery(args: list[str]) -> list[str]:
    from celery.bin.celery import celery as celery_cli

    app_name = None
    rest = list(args)
    for i, arg in enumerate(args):
        if arg in ("-A", "--app") and i + 1 < len(args):
            app_name = args[i + 1]
            rest = args[:i] + args[i + 2 :]
            break
        if arg.startswith("--app="):
            app_name = arg.split("=", 1)[1]
            rest = args[:i] + args[i + 1 :]
            break
    if not app_name:
        return ["celery without -A/--app"]
    problems = []
    module_name = app_name.split(":")[0]
    try:
        module = importlib.import_module(f"{module_name}.celery")
    except ImportError as exc:
        problems.append(f"celery: cannot import {module_name}.celery: {exc}")
    else:
        if not hasattr(module, "app"):
            problems.append(f"celery: {module_name}.celery has no `app`")
    subcommands = [a for a in rest if not a.startswith("-")]
    if not subcommands or subcommands[0] not in celery_cli.commands:
        problems.append(f"celery: no such subcommand in {rest}")
    else:
        sub = celery_cli.commands[subcommands[0]]
        sub_args = rest[rest.index(subcommands[0]) + 1 :]
        problems += [f"celery: unknown option {o}" for o in _click_unknown_options(sub, sub_args)]
    return problems


CHECKERS = {"uvicorn": _check_uvicorn, "celery": _check_celery}
CHECKERS.update(dict.fromkeys(PYTHONS, _check_python))


def command_problems(command: str | list[str] | None) -> list[str]:
    """Why a command of this project's image would not find what it runs; [] when it would."""
    if not command:
        return ["empty command"]
    problems = []
    for argv in command_argvs(command):
        checker = CHECKERS.get(argv[0])
        if checker is None:
            problems.append(f"{argv[0]!r}: not a program this project provides")
        else:
            problems += checker(argv[1:])
    return problems


# --- compose.yaml and the Dockerfile ---------------------------------------------------------


def dockerfile_cmd() -> list[str] | str:
    """The last CMD of the Dockerfile, exec form as a list, shell form as a string."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    cmds = [m.group(1).strip() for m in re.finditer(r"(?im)^\s*CMD\s+(.+)$", text)]
    assert cmds, "Dockerfile has no CMD"
    cmd = cmds[-1]
    return json.loads(cmd) if cmd.startswith("[") else cmd


def built_here(service: dict) -> bool:
    """Whether the service's image is built from this repository."""
    build = service.get("build")
    if build is None:
        return False
    context = build if isinstance(build, str) else build.get("context", ".")
    return (COMPOSE_FILE.parent / context).resolve() == ROOT


def effective_command(service: dict) -> list[str] | str:
    return service.get("command") or dockerfile_cmd()


def compose_problems(data: dict) -> dict[str, list[str]]:
    """Problems of each project-built service's command, by service name."""
    found = {}
    for name, service in data["services"].items():
        if not built_here(service):
            continue
        assert "entrypoint" not in service, f"{name}: an entrypoint would bypass these checks"
        problems = command_problems(effective_command(service))
        if problems:
            found[name] = problems
    return found


def test_services_exist(compose):
    assert "version" not in compose, "the Compose spec has no `version:`"
    assert {
        *("postgres", "redis", "migrate", "web", "worker", "jobs-worker", "beat", "proxy", "agent")
    } <= set(compose["services"])


def test_project_services_are_built_from_this_repository(compose):
    services = compose["services"]
    for name in ("migrate", "web", "worker", "jobs-worker", "beat", "agent"):
        assert built_here(services[name]), name
    assert not built_here(services["postgres"]) and not built_here(services["redis"])


def test_shared_environment(compose):
    services = compose["services"]
    env = compose["x-console-env"]
    for key in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS"):
        assert key in env
        for name in CONSOLE_SERVICES:
            assert key in services[name]["environment"], (name, key)
    assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")


def test_dependencies(compose):
    services = compose["services"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["web"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    for name in ("worker", "jobs-worker", "beat"):
        deps = services[name]["depends_on"]
        assert deps["redis"]["condition"] == "service_healthy"
        assert deps["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["redis"]
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"


def _option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        for name in names:
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def queue_problems(data: dict) -> list[str]:
    """Benchmarks and webhooks (JOBS_QUEUE) must have their own worker, never sharing slots
    with the agents' traffic on CONSOLE_QUEUE; no console worker listens to remote control."""
    from workers.contracts import CONSOLE_QUEUE, JOBS_QUEUE

    problems = []
    consumed: dict[str, list[str]] = {}
    for name, service in data["services"].items():
        argv = command_argvs(service.get("command") or [])[0]
        if argv[:1] != ["celery"] or "worker" not in argv:
            continue
        queues = (_option(argv, "-Q", "--queues") or CONSOLE_QUEUE).split(",")
        for queue in queues:
            consumed.setdefault(queue, []).append(name)
        if CONSOLE_QUEUE in queues and JOBS_QUEUE in queues:
            problems.append(f"{name} consumes both {CONSOLE_QUEUE} and {JOBS_QUEUE}")
        for flag in ("--without-gossip", "--without-mingle"):
            if flag not in argv:
                problems.append(f"{name} runs without {flag}")
        if JOBS_QUEUE in queues and int(_option(argv, "-c", "--concurrency") or 0) not in (1, 2):
            problems.append(f"{name}: {JOBS_QUEUE} wants --concurrency 1 or 2")
    for queue in (CONSOLE_QUEUE, JOBS_QUEUE):
        if not consumed.get(queue):
            problems.append(f"no worker consumes {queue}")
    return problems


def test_jobs_have_their_own_worker(compose):
    assert queue_problems(compose) == []
    assert compose["services"]["jobs-worker"]["environment"] == compose["x-console-env"]


@pytest.mark.parametrize(
    "command, expected",
    [
        (["celery", "-A", "console", "worker", "-Q", "console,console.jobs"], "both"),
        (["celery", "-A", "console", "worker", "-Q", "console"], "no worker consumes console.jobs"),
        (["celery", "-A", "console", "worker", "-Q", "console.jobs", "-c", "8"], "--concurrency"),
    ],
)
def test_queue_check_catches_shared_slots(compose, command, expected):
    broken = copy.deepcopy(compose)
    broken["services"]["jobs-worker"]["command"] = command
    assert any(expected in p for p in queue_problems(broken)), queue_problems(broken)


def test_console_manages_redis_acl_users(compose):
    """Redis >= 7 (ACL selectors); every console service manages the agents' ACL users with a
    bootstrap password of its own, required, and not the console's REDIS_PASSWORD."""
    image = compose["services"]["redis"]["image"]
    major = re.match(r"redis:(\d+)", image)
    assert major and int(major.group(1)) >= 7, image
    env = compose["x-console-env"]
    assert env["REDIS_MANAGE_ACL"] in ("1", "true", "yes", "on")
    assert env["NPU_BOOTSTRAP_REDIS_PASSWORD"].startswith("${NPU_BOOTSTRAP_REDIS_PASSWORD:?")
    for name in CONSOLE_SERVICES:
        assert compose["services"][name]["environment"]["REDIS_MANAGE_ACL"] == "1", name
    agent_hint = COMPOSE_FILE.read_text()
    assert "rediss://npc-bootstrap:<NPU_BOOTSTRAP_REDIS_PASSWORD>@" in agent_hint
    assert "rediss://:<REDIS_PASSWORD>@" not in agent_hint


def test_agent_runs_on_ascend_hosts(compose):
    agent = compose["services"]["agent"]
    assert agent["profiles"] == ["agent"]
    devices = {d.split(":")[0] for d in agent["devices"]}
    assert {f"/dev/davinci{i}" for i in range(8)} <= devices
    assert {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"} <= devices
    mounts = {v.split(":")[0]: v for v in agent["volumes"]}
    for path in (
        "/usr/local/Ascend/driver",
        "/usr/local/dcmi",
        "/usr/local/bin/npu-smi",
        "/etc/ascend_install.info",
    ):
        assert mounts.get(path) == f"{path}:{path}:ro", path
    lib_path = agent["environment"]["LD_LIBRARY_PATH"].split(":")
    for lib in ("", "/common", "/driver"):
        assert f"/usr/local/Ascend/driver/lib64{lib}" in lib_path


def test_every_project_command_exists(compose):
    assert compose_problems(compose) == {}


def test_dockerfile_cmd_exists():
    assert command_problems(dockerfile_cmd()) == []


def test_dockerfile_basics():
    text = DOCKERFILE.read_text()
    assert re.search(r"(?m)^ARG BASE_IMAGE=python:3\.11-slim$", text)
    assert re.search(r"(?m)^WORKDIR /app$", text)
    assert re.search(r"(?m)^EXPOSE 8000$", text)
    assert "NPU_CONSOLE_VAR_DIR=/var/lib/npu-console" in text
    users = re.findall(r"(?m)^USER\s+(\S+)", text)
    assert users and users[-1] not in {"root", "0", "0:0"}
    assert not re.search(r"amd64|x86_64|x86-64", text.split("\nFROM", 1)[1]), "x86-specific"


def test_systemd_unit_runs_the_agent():
    unit = ROOT / "deploy" / "systemd" / "npu-agent.service"
    settings = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    assert settings["EnvironmentFile"] == ["/etc/npu-agent.env"]
    assert settings["Restart"] == ["always"]
    assert settings["KillMode"] == ["process"]
    (exec_start,) = settings["ExecStart"]
    argv = shlex.split(exec_start)
    assert Path(argv[0]).name in PYTHONS
    assert command_problems(["python", *argv[1:]]) == []


@pytest.mark.parametrize(
    "service, command, expected",
    [
        ("worker", "python manage.py no_such_command", "no_such_command"),
        ("migrate", ["python", "manage.py", "migrate", "--no-such-flag"], "--no-such-flag"),
        (
            "migrate",
            ["sh", "-c", "python manage.py migrate --noinput && python manage.py no_such_command"],
            "no_such_command",
        ),
        ("web", "uvicorn console.asgi:no_such_app --port 8000", "no_such_app"),
        ("web", "uvicorn no_such_module:app", "no_such_module"),
        ("worker", ["celery", "-A", "no_such_pkg", "worker"], "no_such_pkg"),
        ("beat", ["celery", "-A", "console", "no_such_subcommand"], "no_such_subcommand"),
        ("agent", ["python", "-m", "workers", "no_such_subcommand"], "no_such_subcommand"),
        ("web", "gunicorn console.wsgi:application", "gunicorn"),
    ],
)
def test_checker_rejects_broken_commands(compose, service, command, expected):
    broken = copy.deepcopy(compose)
    broken["services"][service]["command"] = command
    problems = compose_problems(broken)
    assert service in problems, problems
    assert any(expected in p for p in problems[service]), problems[service]


def test_checker_uses_dockerfile_cmd_when_command_is_absent(compose):
    data = copy.deepcopy(compose)
    del data["services"]["web"]["command"]
    assert effective_command(data["services"]["web"]) == dockerfile_cmd()
    assert "web" not in compose_problems(data)


def test_shell_form_is_split():
    script = "set -e; python manage.py migrate --noinput && exec python manage.py ensure_admin"
    assert command_argvs(["sh", "-c", script]) == [
        ["set", "-e"],
        ["python", "manage.py", "migrate", "--noinput"],
        ["python", "manage.py", "ensure_admin"],
    ]


# --- the production shape: secrets, exposure, TLS --------------------------------------------

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (enough for this file's values)."""

    def one(match: re.Match) -> str:
        name, op, arg = match.groups()
        if name in env and (env[name] or not (op or "").startswith(":")):
            return env[name]
        if op and op.endswith("?"):
            raise KeyError(f"{name}: {arg}")
        return arg if op else ""

    return _VAR.sub(one, value).replace("$$", "$")


def published_ports(service: dict) -> list[int]:
    """The container ports a service publishes on the host (short and long syntax)."""
    ports = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.append(int(entry["target"]))
        else:
            ports.append(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def exposure_problems(data: dict) -> list[str]:
    """Services that put Redis, PostgreSQL or plain-http uvicorn on the host's network."""
    problems = []
    for name, service in data["services"].items():
        if name in {"redis", "postgres", *CONSOLE_SERVICES}:
            if service.get("ports"):
                problems.append(f"{name} publishes {service['ports']}")
            if service.get("network_mode") == "host":
                problems.append(f"{name} uses the host's network")
        for port in published_ports(service):
            if port in {5432, 6379, 8000}:
                problems.append(f"{name} publishes container port {port}")
    return problems


def redis_password_problems(data: dict) -> list[str]:
    problems = []
    redis = data["services"]["redis"]
    cmd = redis["command"]
    if "--requirepass" not in cmd:
        return ["redis runs without --requirepass"]
    password = cmd[cmd.index("--requirepass") + 1]
    if not password.startswith("${REDIS_PASSWORD:?"):
        problems.append(f"redis password is not the required REDIS_PASSWORD: {password!r}")
    env = {"REDIS_PASSWORD": "s3cret"}
    url = interpolate(data["x-console-env"]["REDIS_URL"], env)
    if url != "redis://:s3cret@redis:6379/0":
        problems.append(f"console REDIS_URL does not carry the password: {url!r}")
    for name in CONSOLE_SERVICES:
        if (
            data["services"][name]["environment"].get("REDIS_URL")
            != (data["x-console-env"]["REDIS_URL"])
        ):
            problems.append(f"{name}: REDIS_URL is not the shared one")
    return problems


def test_redis_requires_a_password_the_console_url_carries(compose):
    assert redis_password_problems(compose) == []
    assert compose["services"]["redis"]["environment"]["REDISCLI_AUTH"].startswith(
        "${REDIS_PASSWORD:?"
    ), "the healthcheck's redis-cli must authenticate"


def test_no_service_publishes_redis_postgres_or_plain_http(compose):
    assert exposure_problems(compose) == []
    assert sorted(published_ports(compose["services"]["proxy"])) == [80, 443, 6380]


@pytest.mark.parametrize(
    "service, change, expected",
    [
        ("redis", {"ports": ["127.0.0.1:6379:6379"]}, "redis publishes"),
        ("postgres", {"ports": [{"target": 5432, "published": 5432}]}, "postgres publishes"),
        ("web", {"ports": ["8000:8000"]}, "web publishes"),
        ("proxy", {"ports": ["6379:6379"]}, "container port 6379"),
        ("redis", {"network_mode": "host"}, "host's network"),
    ],
)
def test_exposure_check_catches_a_published_port(compose, service, change, expected):
    broken = copy.deepcopy(compose)
    broken["services"][service].update(change)
    assert any(expected in p for p in exposure_problems(broken))


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["services"]["redis"]["command"].remove("--requirepass"), "without"),
        (
            lambda d: d["x-console-env"].update(REDIS_URL="redis://redis:6379/0"),
            "does not carry",
        ),
        (
            lambda d: d["services"]["worker"]["environment"].update(REDIS_URL="redis://x/0"),
            "worker",
        ),
    ],
)
def test_password_check_catches_a_missing_password(compose, mutate, expected):
    broken = copy.deepcopy(compose)
    mutate(broken)
    assert any(expected in p for p in redis_password_problems(broken))


def parse_nginx(text: str) -> list:
    """nginx.conf as nested [directive, [args], children-or-None] lists."""
    tokens = re.findall(r'"[^"]*"|[{};]|[^\s{};"]+', re.sub(r"(?m)#.*$", "", text))
    stack: list[list] = [[]]
    words: list[str] = []
    for token in tokens:
        if token == "{":
            block = [words[0], words[1:], []]
            stack[-1].append(block)
            stack.append(block[2])
            words = []
        elif token == "}":
            stack.pop()
        elif token == ";":
            stack[-1].append([words[0], words[1:], None])
            words = []
        else:
            words.append(token.strip('"'))
    assert len(stack) == 1 and not words, "unbalanced nginx.conf"
    return stack[0]


def _find(block: list, name: str) -> list:
    return [d for d in block if d[0] == name]


def _upstream_servers(top: list, context: str, upstream: str) -> list[str]:
    (ctx,) = _find(top, context)
    found = [d for d in _find(ctx[2], "upstream") if d[1] == [upstream]]
    assert found, f"no upstream {upstream} in {context}"
    return [d[1][0] for d in _find(found[0][2], "server")]


def proxy_problems(data: dict, conf_text: str) -> list[str]:
    """Whether the proxy serves HTTPS from the web service and TLS from Redis, with the
    certificate from its mounted TLS directory."""
    problems = []
    top = parse_nginx(conf_text)
    proxy = data["services"]["proxy"]
    mounts = {v.rsplit(":", 2)[1]: v.split(":")[0] for v in proxy["volumes"]}
    if mounts.get("/etc/nginx/nginx.conf") != "./deploy/nginx/nginx.conf":
        problems.append("proxy does not mount deploy/nginx/nginx.conf")
    web_cmd = data["services"]["web"]["command"]
    web_port = web_cmd[web_cmd.index("--port") + 1]
    (http,) = _find(top, "http")
    tls_servers = [
        s for s in _find(http[2], "server") if any("ssl" in d[1] for d in _find(s[2], "listen"))
    ]
    if not tls_servers:
        return [*problems, "no https server"]
    (server,) = tls_servers
    if ["443", "ssl"] not in [d[1] for d in _find(server[2], "listen")]:
        problems.append("https server does not listen on 443")
    (location,) = [d for d in _find(server[2], "location") if d[1] == ["/"]]
    (proxy_pass,) = _find(location[2], "proxy_pass")
    upstream = proxy_pass[1][0].removeprefix("http://")
    if _upstream_servers(top, "http", upstream) != [f"web:{web_port}"]:
        problems.append(f"https does not go to web:{web_port}")
    headers = {d[1][0]: d[1][1] for d in _find(location[2], "proxy_set_header")}
    if headers.get("X-Forwarded-Proto") != "https":
        problems.append("X-Forwarded-Proto is not overwritten with https")
    if headers.get("X-Forwarded-For") != "$remote_addr":
        problems.append("X-Forwarded-For is not overwritten with the client's address")
    (stream,) = _find(top, "stream")
    (broker,) = _find(stream[2], "server")
    if ["6380", "ssl"] not in [d[1] for d in _find(broker[2], "listen")]:
        problems.append("the broker port is not TLS on 6380")
    if _upstream_servers(top, "stream", _find(broker[2], "proxy_pass")[0][1][0]) != ["redis:6379"]:
        problems.append("the TLS broker port does not go to redis:6379")
    for srv in (server, broker):
        for key in ("ssl_certificate", "ssl_certificate_key"):
            (path,) = _find(srv[2], key)
            if Path(path[1][0]).parent.as_posix() not in mounts:
                problems.append(f"{key} {path[1][0]} is not in a mounted directory")
    return problems


def test_tls_proxy_points_at_the_web_service_and_redis(compose):
    assert proxy_problems(compose, NGINX_CONF.read_text()) == []
    assert compose["services"]["proxy"]["depends_on"]["web"]["condition"] == "service_healthy"


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("server web:8000;", "server web:8001;", "web:8000"),
        ("server redis:6379;", "server redis:6380;", "redis:6379"),
        ("X-Forwarded-Proto https;", "X-Forwarded-Proto $scheme;", "X-Forwarded-Proto"),
        ("listen 6380 ssl;", "listen 6380;", "not TLS"),
        ("/etc/nginx/tls/privkey.pem;", "/etc/ssl/privkey.pem;", "ssl_certificate_key"),
    ],
)
def test_proxy_check_catches_a_broken_config(compose, old, new, expected):
    text = NGINX_CONF.read_text()
    assert old in text
    problems = proxy_problems(compose, text.replace(old, new, 1))
    assert any(expected in p for p in problems), problems


def compose_console_env(data: dict, values: dict[str, str]) -> dict[str, str]:
    return {k: interpolate(str(v), values) for k, v in data["x-console-env"].items()}


def test_console_settings_under_compose_pass_check_deploy(compose, tmp_path):
    """The web service's environment, as compose resolves it, is `check --deploy` clean."""
    env = compose_console_env(
        compose,
        {
            "SECRET_KEY": secrets.token_urlsafe(50),
            "POSTGRES_PASSWORD": "pg",
            "REDIS_PASSWORD": "rd",
            "NPU_BOOTSTRAP_REDIS_PASSWORD": "bs",
            "CONSOLE_HOST": "console.example.com",
        },
    )
    assert env["ALLOWED_HOSTS"] == "console.example.com"
    assert env["CSRF_TRUSTED_ORIGINS"] == "https://console.example.com"
    env["NPU_CONSOLE_VAR_DIR"] = str(tmp_path)  # /var/lib/npu-console in the image
    keep = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={**keep, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_compose_env_example_names_every_required_variable(compose):
    lines = COMPOSE_FILE.read_text().splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    required = {m.group(1) for m in _VAR.finditer(text) if (m.group(2) or "").endswith("?")}
    listed = set(re.findall(r"(?m)^([A-Z_][A-Z0-9_]*)=", COMPOSE_ENV_EXAMPLE.read_text()))
    assert required <= listed, required - listed
    used = {m.group(1) for m in _VAR.finditer(text)}
    assert listed <= used, f"listed but unused: {listed - used}"


def test_docker_compose_config_accepts_the_file(tmp_path):
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    env = {
        **os.environ,
        "SECRET_KEY": "x" * 50,
        "POSTGRES_PASSWORD": "pg",
        "REDIS_PASSWORD": "rd",
        "NPU_BOOTSTRAP_REDIS_PASSWORD": "bs",
        "CONSOLE_HOST": "console.example.com",
    }
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "--profile", "agent", "config", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# --- the host agent's systemd unit -----------------------------------------------------------


def _unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_systemd_unit_verifies(tmp_path):
    """`systemd-analyze verify` finds nothing (unknown keys, bad values), with ExecStart
    pointed at this checkout's interpreter instead of /opt/npu-console/venv."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    text = UNIT.read_text()
    (exec_start,) = _unit_settings(text)["ExecStart"]
    interpreter = shlex.split(exec_start)[0]
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(f"ExecStart={interpreter}", f"ExecStart={sys.executable}"))
    result = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    unit.write_text(unit.read_text().replace("KillMode=process", "KillMode=process\nKilMode=x"))
    broken = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True)
    assert "KilMode" in broken.stderr, "verify must be able to fail"


def _agent_variables(text: str) -> set[str]:
    return set(re.findall(r"\b(NPU_AGENT_[A-Z_]+|NPU_SMI_[A-Z_]+)\b", text))


def test_agent_deploy_files_name_only_settings_the_agent_reads(compose):
    config_source = (ROOT / "workers" / "config.py").read_text()
    read = {v for v in _agent_variables(config_source) if f'"{v}"' in config_source}
    named = (
        _agent_variables(UNIT.read_text())
        | _agent_variables(AGENT_ENV_EXAMPLE.read_text())
        | set(compose["services"]["agent"]["environment"])
    )
    named = {v for v in named if v.startswith(("NPU_AGENT_", "NPU_SMI_"))}
    assert named and named <= read, named - read


def test_agent_env_example_is_a_valid_agent_config():
    from workers.config import AgentConfig

    env = dict(
        line.split("=", 1)
        for line in AGENT_ENV_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    )
    settings = _unit_settings(UNIT.read_text())
    env.update(v.split("=", 1) for v in settings["Environment"])
    config = AgentConfig.from_env(env)
    # TLS, and the bootstrap user (it may only ask to be enrolled), never the console's password
    assert config.broker_url.startswith("rediss://npc-bootstrap:")
    assert "ssl_cert_reqs=required" in config.broker_url
    state = Path(config.state_dir)
    assert state == Path("/var/lib") / settings["StateDirectory"][0]
    assert settings["WorkingDirectory"] == [str(state)]
