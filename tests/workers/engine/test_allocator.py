"""The `allocator` engine setting: jemalloc / tcmalloc preloaded by the agent from the host's
standard library directories (never a path a user gave), refused with what to install when
absent; and the agent's own probes kept out of the engine's access log."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.contracts import EnginePhase as P
from workers.contracts import EngineSpec
from workers.engine import allocator, runner
from workers.engine.argv import build_argv, build_env, quiet_probes_supported

SYSTEM_JEMALLOC = allocator.find_library("jemalloc")


def make_spec(**fields) -> EngineSpec:
    values = dict(
        replica_id=7,
        generation=1,
        deployment="qwen",
        model_path="/models/qwen",
        served_model_name="qwen",
        port=8001,
        device="cpu",
    )
    return EngineSpec(**(values | fields))


@pytest.fixture
def libdir(tmp_path: Path, monkeypatch) -> Path:
    """The standard directories replaced by one empty directory of the test's."""
    path = tmp_path / "lib"
    path.mkdir()
    monkeypatch.setattr(allocator, "SEARCH_DIRS", (str(path),))
    return path


def test_the_library_is_found_by_its_fixed_names_in_the_standard_directories(tmp_path):
    arch_dir = tmp_path / "usr/lib" / f"{allocator.platform.machine()}-linux-gnu"
    arch_dir.mkdir(parents=True)
    (arch_dir / "libjemalloc.so.2").write_bytes(b"")
    (tmp_path / "usr/lib64").mkdir()
    (tmp_path / "usr/lib64/libtcmalloc.so.4").write_bytes(b"")
    assert allocator.find_library("jemalloc", tmp_path) == str(arch_dir / "libjemalloc.so.2")
    assert allocator.find_library("tcmalloc", tmp_path) == str(
        tmp_path / "usr/lib64/libtcmalloc.so.4"
    )
    assert allocator.find_library("/tmp/evil.so", tmp_path) is None  # a name, never a path
    assert allocator.refusal("", tmp_path) is None


def test_a_missing_library_is_a_refusal_naming_what_to_install(tmp_path):
    why = allocator.refusal("tcmalloc", tmp_path)
    assert "libtcmalloc.so.4" in why and "apt-get install libgoogle-perftools4" in why
    assert "jemalloc" in allocator.refusal("jemalloc", tmp_path)


def test_the_engine_env_preloads_the_found_library_first(libdir):
    (libdir / "libjemalloc.so.2").write_bytes(b"")
    env = build_env(make_spec(allocator="jemalloc"), {}, None)
    assert env["LD_PRELOAD"] == str(libdir / "libjemalloc.so.2")
    cann = {"LD_PRELOAD": "/usr/local/Ascend/lib/libascend_hal.so"}
    env = build_env(make_spec(allocator="jemalloc", device="npu"), {}, cann)
    assert env["LD_PRELOAD"] == f"{libdir}/libjemalloc.so.2:/usr/local/Ascend/lib/libascend_hal.so"
    assert "LD_PRELOAD" not in build_env(make_spec(), {"LD_PRELOAD": "/x.so"}, None)


def test_the_allocator_is_not_a_vllm_flag():
    assert "jemalloc" not in " ".join(build_argv(make_spec(allocator="jemalloc"), "py"))


def test_the_supervisor_refuses_a_start_without_the_library(supervisor, spec, reports, libdir):
    report = supervisor().start(spec(allocator="tcmalloc"))
    assert report.phase == P.FAILED and report.pid is None
    assert "apt-get install libgoogle-perftools4" in report.reason


@pytest.mark.skipif(SYSTEM_JEMALLOC is None, reason="libjemalloc2 is not installed here")
def test_the_engine_runs_with_the_hosts_jemalloc_preloaded(supervisor, spec, reports):
    import psutil

    first = supervisor().start(spec(allocator="jemalloc"))
    reports.wait(P.READY)
    assert psutil.Process(first.pid).environ()["LD_PRELOAD"] == SYSTEM_JEMALLOC
    maps = Path(f"/proc/{first.pid}/maps").read_text()
    assert "libjemalloc" in maps  # loaded, not only named


# --- the access log: the agent's own probes are left out, by vLLM's own flag ---


def test_quiet_probes_need_vllm_0_16():
    assert quiet_probes_supported("0.32.0+cpu") and quiet_probes_supported("0.16.0")
    assert not quiet_probes_supported("0.11.0rc1") and not quiet_probes_supported(None)


def test_the_flag_follows_the_port_only_when_the_engine_has_it():
    argv = build_argv(make_spec(), "py", quiet_probes=True)
    at = argv.index("--disable-access-log-for-endpoints")
    assert argv[at - 2 : at + 2] == [
        "--port",
        "8001",
        "--disable-access-log-for-endpoints",
        "/health,/metrics",
    ]
    assert "--disable-access-log-for-endpoints" not in build_argv(make_spec(), "py")


@pytest.mark.parametrize(("version", "quiet"), [("0.32.0", True), ("0.11.0", False), (None, False)])
def test_the_supervisor_asks_vllm_to_drop_probe_lines_when_it_can(
    supervisor, spec, reports, monkeypatch, version, quiet
):
    monkeypatch.setattr(runner, "package_versions", lambda python: {"vllm": version})
    supervisor().start(spec())
    ready = reports.wait(P.READY)
    header = Path(ready.log_path).read_text().splitlines()[1]
    assert ("--disable-access-log-for-endpoints /health,/metrics" in header) is quiet
