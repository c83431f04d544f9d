"""The agent/console contract: what a heartbeat's chip readings may hold, and the caps on
everything an agent sends (refused with the field and the limit named)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers import contracts as c
from workers.contracts import ChipTelemetry


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("aicore_percent", float("nan")),
        ("temperature_c", float("inf")),
        ("power_w", "-Infinity"),
        ("hbm_used_mb", 10**30),
        ("hbm_total_mb", -1),
        ("memory_used_mb", 2**31),
    ],
)
def test_a_reading_no_npu_reports_becomes_none_and_the_rest_is_kept(field, value):
    chip = ChipTelemetry.model_validate({"npu_id": 3, "health": "OK", field: value})
    assert getattr(chip, field) is None
    assert (chip.npu_id, chip.health) == (3, "OK")


def test_real_readings_pass_unchanged():
    values = {"aicore_percent": 99.5, "temperature_c": -5.0, "hbm_used_mb": 2**31 - 1}
    chip = ChipTelemetry.model_validate({"npu_id": 0, **values, "hbm_total_mb": 0})
    assert chip.model_dump(include=set(values) | {"hbm_total_mb"}) == {**values, "hbm_total_mb": 0}


# --- typed, bounded payloads ----------------------------------------------------------------
NOW = "2026-12-03T10:00:00+00:00"


def engine(**fields):
    return {"node": "kp-01", "replica_id": 7, "generation": 1, "phase": "ready", "at": NOW} | fields


def heartbeat(**fields):
    return {"node": "kp-01", "enroll_token": "npe_" + "x" * 20, "sent_at": NOW} | fields


def refused(model, payload) -> str:
    """The ValidationError's text (it names the field and the limit)."""
    with pytest.raises(ValidationError) as exc:
        model.model_validate(payload)
    return str(exc.value)


@pytest.mark.parametrize(
    ("payload", "field", "limit"),
    [
        (heartbeat(chips=[{"npu_id": i} for i in range(1000)]), "chips", c.MAX_CHIPS),
        (
            heartbeat(processes=[{"npu_id": 0, "pid": i} for i in range(2000)]),
            "processes",
            c.MAX_PROCESSES,
        ),
        (heartbeat(engines=[engine(replica_id=i) for i in range(65)]), "engines", c.MAX_ENGINES),
        (heartbeat(versions={f"k{i}": "1" for i in range(33)}), "versions", c.MAX_VERSIONS),
        (heartbeat(versions={"cann": "8" * 65}), "versions.cann", c.VERSION_MAX_CHARS),
        (heartbeat(versions={"k" * 65: "8"}), "versions", c.VERSION_KEY_MAX_CHARS),
        (heartbeat(host={"cpu_model": "K" * 201}), "host.cpu_model", 200),
        (heartbeat(host={"os": "o" * 201}), "host.os", 200),
        (heartbeat(host={"kernel": "k" * 101}), "host.kernel", 100),
        (heartbeat(host={"arch": "a" * 33}), "host.arch", 32),
        (heartbeat(host={"disks": {f"/d{i}": {} for i in range(65)}}), "host.disks", c.MAX_DISKS),
        (
            heartbeat(host={"numa_cpulists": {f"node{i}": "0" for i in range(65)}}),
            "host.numa_cpulists",
            c.MAX_NUMA_NODES,
        ),
        (
            heartbeat(host={"interfaces": {f"eth{i}": ["10.0.0.1"] for i in range(65)}}),
            "host.interfaces",
            c.MAX_INTERFACES,
        ),
        (
            heartbeat(host={"interfaces": {"eth0": [f"10.0.0.{i}" for i in range(17)]}}),
            "host.interfaces.eth0",
            c.MAX_INTERFACE_ADDRESSES,
        ),
        (
            heartbeat(host={"interfaces": {"e" * 16: ["10.0.0.1"]}}),
            "host.interfaces",
            c.IFNAME_MAX_CHARS,
        ),
        (
            heartbeat(host={"interfaces": {"eth0": ["1" * 65]}}),
            "host.interfaces.eth0.0",
            c.IP_MAX_CHARS,
        ),
        (heartbeat(telemetry_reason="r" * 301), "telemetry_reason", c.STATUS_TEXT_MAX_CHARS),
        (heartbeat(log_error="e" * 301), "log_error", c.STATUS_TEXT_MAX_CHARS),
        (heartbeat(agent_version="1" * 33), "agent_version", 32),
        (heartbeat(chips=[{"npu_id": 0, "name": "n" * 65}]), "chips.0.name", 64),
        (heartbeat(chips=[{"npu_id": 0, "bus_id": "b" * 33}]), "chips.0.bus_id", 32),
        (heartbeat(processes=[{"npu_id": 0, "pid": 1, "name": "p" * 257}]), "name", 256),
        (heartbeat(engines=[engine(reason="r" * 501)]), "engines.0.reason", c.REASON_MAX_CHARS),
        (
            heartbeat(engines=[engine(log_tail=["l"] * 51)]),
            "engines.0.log_tail",
            c.LOG_TAIL_MAX_LINES,
        ),
        (
            heartbeat(engines=[engine(log_tail=["l" * 2001])]),
            "engines.0.log_tail.0",
            c.LOG_TAIL_LINE_MAX_CHARS,
        ),
        (
            heartbeat(engines=[engine(metrics={f"m{i}": 1 for i in range(129)})]),
            "engines.0.metrics",
            c.MAX_METRICS,
        ),
        (
            heartbeat(engines=[engine(metrics={"m" * 129: 1})]),
            "engines.0.metrics",
            c.METRIC_NAME_MAX_CHARS,
        ),
    ],
)
def test_every_cap_is_refused_naming_the_field_and_the_limit(payload, field, limit):
    text = refused(c.Heartbeat, payload)
    assert field in text and str(limit) in text


@pytest.mark.parametrize("value", ["lots", -1, float("nan"), float("inf"), True, None, "5"])
def test_a_metric_that_is_not_a_finite_non_negative_number_is_refused(value):
    text = refused(
        c.Heartbeat, heartbeat(engines=[engine(metrics={"num_requests_running": value})])
    )
    assert "engines.0.metrics.num_requests_running" in text


def test_an_engine_entry_without_replica_id_is_refused():
    entry = engine()
    del entry["replica_id"]
    assert "engines.0.replica_id" in refused(c.Heartbeat, heartbeat(engines=[entry]))


def test_engines_are_typed_reports():
    hb = c.Heartbeat.model_validate(heartbeat(engines=[engine(metrics={"kv": 0.5, "n": 3})]))
    assert isinstance(hb.engines[0], c.EngineReport) and hb.engines[0].metrics == {
        "kv": 0.5,
        "n": 3,
    }


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:9/evil?x=", "kp-01.dc", "::1 ", " 10.0.0.1", "010.0.0.1", "fe80::1%eth0", "[::1]"],
)
def test_an_address_that_is_not_an_ip_address_is_refused(address):
    assert "host.address" in refused(c.Heartbeat, heartbeat(host={"address": address}))


@pytest.mark.parametrize(
    ("address", "stored"),
    [("", ""), ("10.1.2.3", "10.1.2.3"), ("2001:DB8:0::0:1", "2001:db8::1"), ("::1", "::1")],
)
def test_an_ip_address_is_kept_in_canonical_form(address, stored):
    assert c.Heartbeat.model_validate(heartbeat(host={"address": address})).host.address == stored


@pytest.mark.parametrize("hostname", ["kp-01/../x", "a b", "h?x=1", "x" * 254])
def test_a_hostname_that_is_no_host_name_is_refused(hostname):
    assert "host.hostname" in refused(c.Heartbeat, heartbeat(host={"hostname": hostname}))


def test_what_the_agent_sends_for_its_host_is_kept():
    from workers.accelerators.host import host_metrics

    host = {**host_metrics(), "address": "192.0.2.7"}
    hb = c.Heartbeat.model_validate(heartbeat(host=host))
    dumped = hb.host.model_dump()
    assert set(host) <= set(dumped)  # every field the agent sends has a typed home
    assert hb.host.cpu_cores.logical == host["cpu_cores"]["logical"]
    assert dumped["disks"]["/"]["total_mb"] == host["disks"]["/"]["total_mb"]


def test_log_batch_caps_each_line_and_the_total():
    batch = {"node": "kp-01", "replica_id": 1, "generation": 1, "run": 1, "file": "gen1-run1.log"}
    batch["first_line_no"] = 1
    line = "x" * c.LOG_LINE_MAX_CHARS
    assert c.LogBatch.model_validate({**batch, "lines": [line]})
    text = refused(c.LogBatch, {**batch, "lines": [line + "x"]})
    assert "lines.0" in text and str(c.LOG_LINE_MAX_CHARS) in text
    many = [line] * (c.LOG_BATCH_MAX_CHARS // c.LOG_LINE_MAX_CHARS + 1)
    assert str(c.LOG_BATCH_MAX_CHARS) in refused(c.LogBatch, {**batch, "lines": many})
    text = refused(c.LogBatch, {**batch, "lines": ["x"] * (c.LOG_BATCH_MAX_LINES + 1)})
    assert "lines" in text and str(c.LOG_BATCH_MAX_LINES) in text


def test_check_report_is_typed_and_capped():
    report = {"node": "kp-01", "run_id": 3, "trigger": "on-demand", "sent_at": NOW}
    ok = {"name": "npu-smi", "ok": True, "evidence": "8 chips"}
    assert c.CheckReport.model_validate({**report, "results": [ok]}).results[0].ok
    text = refused(c.CheckReport, {**report, "results": [ok] * (c.MAX_CHECK_RESULTS + 1)})
    assert "results" in text and str(c.MAX_CHECK_RESULTS) in text
    long = {**ok, "evidence": "e" * (c.CHECK_TEXT_MAX_CHARS + 1)}
    text = refused(c.CheckReport, {**report, "results": [long]})
    assert "results.0.evidence" in text and str(c.CHECK_TEXT_MAX_CHARS) in text
    assert "trigger" in refused(c.CheckReport, {**report, "trigger": "t" * 17, "results": []})


def test_clip_cuts_visibly_within_the_limit():
    assert c.clip("short", 10) == "short"
    cut = c.clip("é" * 20_000, 1000)
    assert len(cut) <= 1000 and cut.startswith("é") and cut.endswith(" bytes]")
    kept = len(cut.split("…")[0])
    assert f"[cut {(20_000 - kept) * 2} bytes]" in cut


def test_fit_metrics_keeps_what_the_console_accepts():
    metrics = {"a": 1, "b": -1.0, "c": float("nan"), "d": float("inf"), "e": 10**400, "f": 2.5}
    assert c.fit_metrics(metrics) == {"a": 1.0, "f": 2.5}


def test_describe_names_fields_without_the_input():
    with pytest.raises(ValidationError) as exc:
        c.Heartbeat.model_validate(heartbeat(host={"address": "secret-ish/x"}, seq=-1))
    line = c.describe(exc.value)
    assert "host.address" in line and "seq" in line


def test_interfaces_are_optional_and_kept_as_sent():
    assert c.Heartbeat.model_validate(heartbeat()).host.interfaces == {}  # an older agent
    sent = {"lo": ["127.0.0.1", "::1"], "enp189s0f0": ["10.0.0.2", "fe80::1%enp189s0f0"]}
    hb = c.Heartbeat.model_validate(heartbeat(host={"interfaces": sent}))
    assert hb.host.interfaces == sent


def test_an_engine_spec_without_a_group_is_a_single_host_spec():
    fields = {"deployment": "d", "model_path": "/m", "served_model_name": "m", "port": 8000}
    spec = c.EngineSpec(replica_id=1, generation=1, **fields)
    assert spec.group is None and not spec.follower
    grouped = c.EngineSpec.model_validate(
        spec.model_dump()
        | {
            "data_parallel_size": 2,
            "group": {
                "rank": 1,
                "size": 2,
                "data_parallel_size": 2,
                "leader_address": "10.0.0.1",
                "rpc_port": 13389,
                "local_address": "10.0.0.2",
                "interface": "eth0",
            },
        }
    )
    assert grouped.follower and grouped.group.local_dp == 1


def test_the_contract_imports_first_without_a_cycle():
    """contracts imports workers.engine.group; the engine package must not import the
    contract back while that happens (its names load lazily: workers/engine/__init__.py)."""
    import subprocess
    import sys

    code = "import workers.contracts, workers.engine as e; assert e.Supervisor and e.build_argv"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
