"""compose.yaml and the Dockerfile, checked without Docker.

Every command a container of this project's image runs must name something that exists here:
a management command, an ASGI application, a Celery app and subcommand, an agent subcommand.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"

PYTHONS = {"python", "python3", "python3.11"}
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
    assert {"postgres", "redis", "migrate", "web", "worker", "beat", "agent"} <= set(
        compose["services"]
    )


def test_project_services_are_built_from_this_repository(compose):
    services = compose["services"]
    for name in ("migrate", "web", "worker", "beat", "agent"):
        assert built_here(services[name]), name
    assert not built_here(services["postgres"]) and not built_here(services["redis"])


def test_shared_environment(compose):
    services = compose["services"]
    env = compose["x-console-env"]
    for key in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS"):
        assert key in env
        for name in ("migrate", "web", "worker", "beat"):
            assert key in services[name]["environment"], (name, key)
    assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")


def test_dependencies(compose):
    services = compose["services"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["web"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    for name in ("worker", "beat"):
        deps = services[name]["depends_on"]
        assert deps["redis"]["condition"] == "service_healthy"
        assert deps["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["redis"]
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"


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
