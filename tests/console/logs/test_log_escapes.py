"""Terminal escape sequences from a host never reach a page, a download, the API or an
incident raw: a hostile or merely colourful engine log is cleaned on the console's intake
(workers.engine.shipper.strip_controls, called by mask_secrets), whatever the agent did."""

from __future__ import annotations

import json

import pytest

from console.diagnosis.models import Incident
from console.logs.models import LogLine
from tests.node_support import sealed
from tests.security.hostile_hosts import engine_report, log_batch, make_fleet
from workers.contracts import Tasks
from workers.engine.shipper import mask_secrets, strip_controls

pytestmark = [pytest.mark.security, pytest.mark.django_db]

# (as the host sends it, as it is kept): real sequences, 7-bit and 8-bit
HOSTILE = [
    ("\x1b]52;c;ZXZpbCBjbGlwYm9hcmQ=\x07INFO clipboard", "INFO clipboard"),  # OSC 52, BEL
    ("\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\ INFO link", "click me INFO link"),
    ("\x1b[31mERROR\x1b[0m red", "ERROR red"),  # CSI colour
    ("\x9b31mWARNING\x9b0m eight-bit", "WARNING eight-bit"),  # 8-bit CSI (C1)
    ("\x1b]0;owned title\x07INFO title", "INFO title"),  # OSC 0: window title
    ("\x9d52;c;cGFzdGU=\x9cINFO c1 osc", "INFO c1 osc"),  # 8-bit OSC ... ST
    ("INFO bell\x07 nul\x00 del\x7f nel\x85 rlo\u202e", "INFO bell nul del nel rlo"),
    ("Loading 10%\rLoading 100%", "Loading 100%"),  # a progress bar: what a terminal shows
    ("INFO keeps\ttabs", "INFO keeps\ttabs"),
]
RAW = ("\x1b", "\x9b", "\x9d", "\x9c", "\x07", "\x00", "\x85", "\u202e", "evil.example", "ZXZp")


def no_raw(text: str) -> bool:
    return not any(bad in text for bad in RAW)


@pytest.fixture
def fleet():
    return make_fleet()


def test_strip_controls_removes_whole_sequences_and_keeps_the_text():
    for raw, kept in HOSTILE:
        assert strip_controls(raw) == kept, raw
    assert strip_controls("a\nb\x1b[1m\nc") == "a\nb\nc"  # never adds or removes a newline
    plain = "INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.32.0"
    assert strip_controls(plain) is plain


def test_a_colour_code_cannot_hide_a_secret_from_the_masking():
    assert mask_secrets("Authorization: Bearer \x1b[1mtok_abcdef") == "Authorization: Bearer ***"


def test_shipped_lines_are_clean_in_the_database_the_api_the_download_and_the_page(
    fleet, viewer_client
):
    replica = fleet.replica_b
    batch = log_batch(fleet.b.node, replica, lines=[raw for raw, _ in HOSTILE])
    assert fleet.send(sealed(fleet.b, Tasks.LOG_LINES, batch)) == {"ok": 1}
    stored = list(LogLine.objects.filter(replica=replica).order_by("line_no"))
    assert [line.text for line in stored] == [kept for _, kept in HOSTILE]
    assert [line.level for line in stored][:4] == ["info", "info", "error", "warning"]

    api = viewer_client.get(f"/api/v1/replicas/{replica.pk}/logs")
    assert api.status_code == 200 and [x["text"] for x in api.json()["lines"]] == [
        kept for _, kept in HOSTILE
    ]
    assert no_raw(api.content.decode())  # nor their payloads (URLs, clipboard data)

    download = viewer_client.get(f"/api/v1/replicas/{replica.pk}/logs/download")
    text = b"".join(download.streaming_content).decode()
    assert download.status_code == 200 and no_raw(text)
    assert text.splitlines()[0] == "INFO clipboard"

    page = viewer_client.get(f"/replicas/{replica.pk}/logs/").content.decode()
    assert "INFO clipboard" in page and no_raw(page)


def test_lines_stored_before_the_intake_cleaned_them_are_shown_clean(fleet, viewer_client):
    replica = fleet.replica_b
    LogLine.objects.create(
        replica=replica, generation=replica.generation, run=1, line_no=1, text=HOSTILE[0][0]
    )
    api = viewer_client.get(f"/api/v1/replicas/{replica.pk}/logs").json()
    assert api["lines"][0]["text"] == "INFO clipboard"
    download = viewer_client.get(f"/api/v1/replicas/{replica.pk}/logs/download")
    assert b"".join(download.streaming_content).decode() == "INFO clipboard\n"


def test_a_failure_reports_tail_is_clean_in_the_incident_evidence_and_the_replica_api(
    fleet, viewer_client
):
    replica = fleet.replica_b
    tail = [raw for raw, _ in HOSTILE] + ["\x1b[31mRuntimeError: NPU out of memory\x1b[0m"]
    report = engine_report(
        fleet.b.node, replica, reason="\x1b]0;pwned\x07engine exited", log_tail=tail
    )
    assert fleet.send(sealed(fleet.b, Tasks.ENGINE_REPORT, report)) == {"ok": 1}
    incident = Incident.objects.get(replica=replica)
    assert no_raw(json.dumps(incident.evidence, ensure_ascii=False))
    assert no_raw(incident.title)
    texts = [row["text"] for block in incident.evidence for row in block.get("context", [])]
    assert "RuntimeError: NPU out of memory" in texts
    detail = viewer_client.get(f"/api/v1/incidents/{incident.pk}")
    assert detail.status_code == 200 and no_raw(detail.content.decode())
    page = viewer_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert no_raw(page)
    tail = viewer_client.get(f"/api/v1/replicas/{replica.pk}").json()["log_tail"]
    assert "RuntimeError: NPU out of memory" in tail  # as the API shows the replica's tail
    assert all(no_raw(line) for line in tail)
