"""An engine's report as the agent sends it: always within the contract's caps."""

from __future__ import annotations

from datetime import UTC, datetime

from workers import contracts as c
from workers.engine.state import Engine


def test_a_report_fits_the_caps_whatever_the_engine_said(tmp_path):
    spec = c.EngineSpec(
        replica_id=7,
        generation=1,
        deployment="d1",
        model_path="/models/m",
        served_model_name="m",
        port=8100,
    )
    engine = Engine(spec=spec, directory=tmp_path, reason="x" * 5000)
    engine.metrics = {"num_requests_running": float("nan"), "kv": -0.5, "tokens": 12.0}
    engine.log_tail = ["Traceback " + "y" * 10_000] * 80
    report = engine.report("kp-01")
    hb = {"node": "kp-01", "enroll_token": "npe_" + "x" * 20, "sent_at": datetime.now(UTC)}
    sent = c.Heartbeat.model_validate({**hb, "engines": [report.model_dump(mode="json")]})
    got = sent.engines[0]
    assert got.metrics == {"tokens": 12.0}
    assert len(got.reason) <= c.REASON_MAX_CHARS and "[cut " in got.reason
    assert len(got.log_tail) == c.LOG_TAIL_MAX_LINES
    assert all(len(line) <= c.LOG_TAIL_LINE_MAX_CHARS for line in got.log_tail)
