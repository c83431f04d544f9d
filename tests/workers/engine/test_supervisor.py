"""The supervisor against a fake vLLM: phases, idempotent starts, refusals, crashes, stops."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from tests.workers.engine.helpers import alive, wait_for
from workers.contracts import EnginePhase as P
from workers.engine.process import port_in_use


def child_pid(log_path: str) -> int:
    def found():
        match = re.search(r"child pid (\d+)", open(log_path).read())
        return int(match[1]) if match else None

    return wait_for(found, 10, "the fake's child pid in its log")


def test_start_goes_starting_loading_ready_in_order(supervisor, spec, reports):
    sup = supervisor()
    first = sup.start(spec(extra_env={"FAKE_LOAD_DELAY_S": "0.4"}))
    assert first.phase == P.STARTING and alive(first.pid)
    ready = reports.wait(P.READY)
    assert reports.phases() == [P.STARTING, P.LOADING, P.READY]
    assert ready.pid == first.pid and "lists tiny" in ready.reason
    state = json.loads((sup.state_dir / "engines/1/state.json").read_text())
    assert state["pid"] == first.pid and state["create_time"] and state["generation"] == 1
    assert ready.log_path.endswith("engines/1/gen1-run1.log")
    wait_for(lambda: sup.reports()[0].metrics.get("generation_tokens_total"), 5, "metrics")
    assert sup.reports()[0].metrics["kv_cache_usage_perc"] == 0.25


def test_engine_gets_the_built_argv_and_env_but_no_agent_secret(supervisor, spec, reports):
    sup = supervisor()
    sup.start(spec(max_model_len=512, enforce_eager=True))
    ready = reports.wait(P.READY)
    text = open(ready.log_path).read()
    assert "--max-model-len" in text and "--enforce-eager" in text
    assert "env VLLM_CPU_KVCACHE_SPACE=1" in text and "env HF_HUB_OFFLINE=1" in text
    assert "env ASCEND_RT_VISIBLE_DEVICES=None" in text  # device cpu: never set
    assert "hf_secret_never_logged" not in text and "agent-secret" not in text
    assert "HF_TOKEN" not in text  # not allow-listed
    assert "VLLM_API_KEY" not in text and "vllm-secret-key" not in text  # the agent's: dropped


@pytest.mark.security
def test_the_replica_key_reaches_the_engine_by_env_only_and_the_probes_send_it(
    supervisor, spec, reports
):
    key = "k" * 24 + "-replica_1"
    sup = supervisor()
    first = sup.start(spec(api_key=key))
    ready = reports.wait(P.READY)  # /v1/models answers 401 without the key: probes sent it
    assert ready.pid == first.pid and "lists tiny" in ready.reason
    text = open(ready.log_path).read()
    assert "VLLM_API_KEY=***" in text and key not in text  # the header shows it redacted
    assert key not in " ".join(psutil.Process(first.pid).cmdline())
    assert psutil.Process(first.pid).environ()["VLLM_API_KEY"] == key
    state = sup.state_dir / "engines/1/state.json"
    assert state.stat().st_mode & 0o777 == 0o600  # it holds the spec, and so the key
    assert json.loads(state.read_text())["spec"]["api_key"] == key
    assert key not in repr(sup.reports()) and key not in repr(spec(api_key=key))


def test_engine_host_binds_npu_engines_to_the_data_plane_address(supervisor, spec, reports):
    sup = supervisor(engine_host="127.0.0.1")
    sup.start(spec(device="npu", host="0.0.0.0"))
    reports.wait(P.READY)
    state = json.loads((sup.state_dir / "engines/1/state.json").read_text())
    assert state["spec"]["host"] == "127.0.0.1"
    assert '"--host", "127.0.0.1"' in open(reports.last(P.READY).log_path).read()


def test_same_generation_again_is_a_no_op(supervisor, spec, reports):
    sup = supervisor()
    the_spec = spec()
    first = sup.start(the_spec)
    reports.wait(P.READY)
    again = sup.start(the_spec)
    assert again.phase == P.READY and again.pid == first.pid
    assert reports.phases().count(P.STARTING) == 1
    assert len(sup.reports()) == 1


def test_concurrent_starts_of_one_spec_run_one_engine(supervisor, spec, reports):
    sup = supervisor()
    the_spec = spec()
    with ThreadPoolExecutor(4) as pool:
        pids = set(pool.map(lambda _: sup.start(the_spec).pid, range(4)))
    assert len(pids) == 1 and reports.phases().count(P.STARTING) == 1


def test_a_stop_for_an_older_generation_changes_nothing(supervisor, spec, reports):
    sup = supervisor()
    running = sup.start(spec(generation=3))
    assert sup.stop(1, generation=2).phase != P.STOPPED and alive(running.pid)
    assert sup.stop(1, generation=3).phase == P.STOPPED and not alive(running.pid)


def test_higher_generation_stops_the_old_one_first(supervisor, spec, reports):
    sup = supervisor()
    old = sup.start(spec())
    reports.wait(P.READY)
    new = sup.start(spec(generation=2, port=old.port))
    assert new.generation == 2 and new.pid != old.pid and not alive(old.pid)
    assert reports.phases(generation=1)[-2:] == [P.STOPPING, P.STOPPED]
    assert new.log_path.endswith("gen2-run1.log")
    wait_for(lambda: reports.last(P.READY) and reports.last(P.READY).generation == 2)
    assert sup.start(spec(generation=1, port=old.port)).generation == 2  # stale: ignored


def test_port_already_taken_is_refused_without_a_process(supervisor, spec, reports):
    sup = supervisor()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        report = sup.start(spec(port=taken.getsockname()[1]))
    assert report.phase == P.FAILED and report.pid is None
    assert f"port {report.port} is already in use" in report.reason
    assert reports.phases() == [P.FAILED]
    assert sup.reports() == [] and not (sup.state_dir / "engines/1/state.json").exists()


def test_missing_model_path_or_config_is_refused(supervisor, spec, tmp_path):
    sup = supervisor()
    missing = sup.start(spec(model_path=str(tmp_path / "nope")))
    assert missing.phase == P.FAILED and str(tmp_path / "nope") in missing.reason
    empty = tmp_path / "empty"
    empty.mkdir()
    no_config = sup.start(spec(model_path=str(empty)))
    assert no_config.phase == P.FAILED and f"{empty} has no config.json" in no_config.reason
    assert sup.reports() == []


def test_crashes_back_off_restart_with_new_logs_then_crash_loop(supervisor, spec, reports):
    sup = supervisor()
    sup.start(spec(restart_max=3, extra_env={"FAKE_CRASH_AFTER_S": "0.3", "FAKE_EXIT_CODE": "3"}))
    loop = reports.wait(P.CRASH_LOOP, 15)
    assert "3 crash(es) within 60s" in loop.reason and "exited with code 3" in loop.reason
    phases = [p for p in reports.phases() if p in (P.STARTING, P.FAILED, P.BACKOFF)]
    assert phases == [P.STARTING, P.FAILED, P.BACKOFF] * 2 + [P.STARTING, P.FAILED]
    failed = reports.last(P.FAILED)
    assert failed.exit_code == 3 and any("crashing with exit code 3" in x for x in failed.log_tail)
    assert loop.restarts == 2 and loop.log_path.endswith("gen1-run3.log")
    logs = sorted(p.name for p in (sup.state_dir / "engines/1").glob("*.log"))
    assert logs == ["gen1-run1.log", "gen1-run2.log", "gen1-run3.log"]
    assert sup.start(spec(restart_max=3)).phase == P.CRASH_LOOP  # same generation: no retry


def test_exit_code_0_without_a_stop_is_a_failure(supervisor, spec, reports):
    sup = supervisor()
    sup.start(spec(restart_max=1, extra_env={"FAKE_CRASH_AFTER_S": "0.5", "FAKE_EXIT_CODE": "0"}))
    reports.wait(P.CRASH_LOOP)
    failed = reports.last(P.FAILED)
    assert failed.exit_code == 0 and "without being asked to stop" in failed.reason


def test_sigterm_ignored_gets_sigkill_after_grace_and_no_process_left(supervisor, spec, reports):
    sup = supervisor(stop_grace_s=1.0)
    started = sup.start(spec(extra_env={"FAKE_IGNORE_SIGTERM": "1", "FAKE_CHILD": "1"}))
    ready = reports.wait(P.READY)
    child = child_pid(ready.log_path)
    assert os.getpgid(child) == started.pid  # the child is in the engine's group
    t0 = time.monotonic()
    stopped = sup.stop(1, 1)
    assert time.monotonic() - t0 >= 1.0
    assert stopped.phase == P.STOPPED and "SIGKILL after 1s" in stopped.reason
    assert not alive(started.pid) and not alive(child)
    assert not port_in_use("127.0.0.1", started.port)
    assert not (sup.state_dir / "engines/1/state.json").exists() and sup.reports() == []
    assert sup.stop(1, 1).phase == P.STOPPED  # idempotent


def test_stop_with_sigterm_ends_the_child_too(supervisor, spec, reports):
    sup = supervisor(stop_grace_s=10.0)
    started = sup.start(spec(extra_env={"FAKE_CHILD": "1"}))
    child = child_pid(reports.wait(P.READY).log_path)
    t0 = time.monotonic()
    stopped = sup.stop(1)
    assert time.monotonic() - t0 < 5 and "SIGKILL" not in stopped.reason
    assert stopped.exit_code == 0 and not alive(started.pid) and not alive(child)


def test_no_answer_on_port_times_out_and_terminates(supervisor, spec, reports):
    sup = supervisor(phase_timeouts={"starting": 0.5})
    started = sup.start(spec(restart_max=1, extra_env={"FAKE_START_DELAY_S": "30"}))
    failed = reports.wait(P.FAILED)
    assert failed.reason == f"no answer on port {started.port} after 0.5s (phase starting)"
    assert reports.wait(P.CRASH_LOOP) and not alive(started.pid)


def test_no_healthy_answer_while_loading_times_out(supervisor, spec, reports):
    sup = supervisor(phase_timeouts={"loading": 0.5})
    started = sup.start(spec(restart_max=1, extra_env={"FAKE_LOAD_DELAY_S": "30"}))
    failed = reports.wait(P.FAILED)
    port = started.port
    assert (
        failed.reason
        == f"no healthy answer on port {port} (/health: HTTP 503) after 0.5s (phase loading)"
    )
    assert failed.signal is None and failed.exit_code == 0  # the fake exits 0 on SIGTERM
    assert any("Application startup complete." in line for line in failed.log_tail)


def test_an_interpreter_that_cannot_start_is_failed_and_not_kept(supervisor, spec, tmp_path):
    sup = supervisor(python=str(tmp_path / "no-python"))
    report = sup.start(spec())
    assert report.phase == P.FAILED and "could not start" in report.reason
    assert sup.reports() == [] and report.pid is None


def test_npu_engine_sees_only_its_npus(supervisor, spec, reports):
    sup = supervisor()
    sup.start(spec(device="npu", npu_ids=[2, 3], tensor_parallel_size=2))
    text = open(reports.wait(P.READY).log_path).read()
    assert "env ASCEND_RT_VISIBLE_DEVICES=2,3" in text and "env VLLM_CPU_KVCACHE_SPACE=None" in text


def test_hang_is_unhealthy(supervisor, spec, reports):
    sup = supervisor(hang_after_s=0.5)
    sup.start(spec(extra_env={"FAKE_HANG": "1"}))
    reports.wait(P.READY)
    unhealthy = reports.wait(P.UNHEALTHY)
    assert "2 request(s) waiting and no token generated" in unhealthy.reason


def test_failing_health_is_unhealthy_then_recovers(supervisor, spec, reports):
    sup = supervisor()
    env = {"FAKE_HEALTH_FAIL_FROM_S": "0.5", "FAKE_HEALTH_FAIL_FOR_S": "1.0"}
    sup.start(spec(extra_env=env))
    unhealthy = reports.wait(P.UNHEALTHY)
    assert "/health: HTTP 503 (3 failures in a row)" in unhealthy.reason
    wait_for(lambda: reports.phases()[-1] == P.READY, 10, "recovery")
    assert reports.last(P.READY).reason.startswith("recovered")


def test_a_failing_report_callback_does_not_stop_supervision(supervisor, spec):
    def broken(report):
        raise RuntimeError("broker down")

    sup = supervisor(report=broken)
    sup.start(spec())
    wait_for(lambda: sup.reports()[0].phase == P.READY, 10, "ready despite the callback")


def test_log_tail_reads_the_current_run(supervisor, spec, reports):
    sup = supervisor()
    sup.start(spec())
    reports.wait(P.READY)
    chunk = sup.log_tail(1, 0, 1 << 20)
    assert "Application startup complete." in chunk["text"] and not chunk["overflow"]
    assert chunk["path"].endswith("gen1-run1.log") and chunk["next_offset"] > 0
    assert sup.log_tail(1, chunk["next_offset"])["text"] == ""
    assert sup.log_tail(99) == {"text": "", "next_offset": 0, "overflow": False, "path": None}


def test_a_chatty_engine_log_stays_bounded_and_readers_see_overflow(supervisor, spec, reports):
    sup = supervisor(log_max_bytes=4000)
    sup.start(spec(extra_env={"FAKE_SPAM_LINES_PER_S": "400"}))
    path = Path(reports.wait(P.READY).log_path)
    wait_for(lambda: sup.log_tail(1, 0)["overflow"], 10, "two rotations")
    assert path.stat().st_size < 4000 + 20_000  # bounded: the limit plus one interval's lines
    chunk = sup.log_tail(1, 0, 1000)
    assert chunk["overflow"] and chunk["next_offset"] > 4000
    assert re.match(r"fake-vllm: spam \d{6} x+\n", chunk["text"])  # whole lines


def test_stop_all_recorded_ends_engines_left_by_a_gone_agent(supervisor, spec, reports):
    from workers.engine.supervisor import stop_all_recorded

    sup = supervisor()
    pid = sup.start(spec()).pid
    reports.wait(P.READY)
    sup.shutdown()  # the agent goes away; the engine keeps running by design
    assert alive(pid)
    assert stop_all_recorded(sup.state_dir, grace_s=5) == 1
    wait_for(lambda: not alive(pid), 10, "the engine to be gone")
    assert not list(sup.state_dir.glob("engines/*/state.json"))
