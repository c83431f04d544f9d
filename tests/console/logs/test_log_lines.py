"""Shipped log lines: idempotent ingest, cursor paging, masking, retention, the live page."""

from __future__ import annotations

import pytest

from console.logs import services
from console.logs.models import LogLine
from console.logs.tasks import purge
from tests.kit import make_deployment, make_node, make_replica


def log_lines(payload: dict) -> int:
    """A batch as the inbox hands it over (authenticated, placement checked there)."""
    return services.ingest_batch(payload=payload)


pytestmark = pytest.mark.django_db


@pytest.fixture
def replica():
    node = make_node("kp-01", npus=1)
    dep = make_deployment("d1", model_path="/models/x", served_model_name="x")
    return make_replica(dep, node=node)


def batch(replica, lines, first=1, run=1, generation=1, **extra):
    return {
        "node": "kp-01",
        "replica_id": replica.pk,
        "generation": generation,
        "run": run,
        "file": f"gen{generation}-run{run}.log",
        "first_line_no": first,
        "lines": lines,
        **extra,
    }


def stored(replica, run=1):
    rows = LogLine.objects.filter(replica=replica, run=run).order_by("line_no")
    return [(r.line_no, r.text) for r in rows]


def test_the_same_batch_twice_is_stored_once(replica):
    payload = batch(replica, ["INFO a", "ERROR b"])
    log_lines(payload)
    log_lines(payload)
    assert stored(replica) == [(1, "INFO a"), (2, "ERROR b")]
    assert list(LogLine.objects.order_by("line_no").values_list("level", flat=True)) == [
        "info",
        "error",
    ]


def test_batches_arriving_out_of_order_are_read_in_line_order(replica):
    log_lines(batch(replica, ["c", "d"], first=3))
    log_lines(batch(replica, ["a", "b"], first=1))
    assert stored(replica) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]


def test_secrets_are_never_stored_even_from_an_agent_that_did_not_mask(replica):
    log_lines(batch(replica, ["HF_TOKEN=hf_abcdefghijklmnopqrstu", "Authorization: Bearer tok"]))
    texts = " ".join(LogLine.objects.values_list("text", flat=True))
    assert "hf_abcdef" not in texts and "tok" not in texts.replace("TOKEN", "")


def test_a_batch_from_another_node_or_for_a_gone_replica_is_dropped(replica):
    assert log_lines(dict(batch(replica, ["x"]), node="intruder")) == 0
    assert log_lines(dict(batch(replica, ["x"]), replica_id=99999)) == 0
    assert not LogLine.objects.exists()


def test_levels_and_tracebacks_are_parsed(replica):
    log_lines(
        batch(
            replica,
            ["WARNING 12-02 x", "DEBUG y", "Traceback (most recent call last):", "plain"],
        )
    )
    levels = list(LogLine.objects.order_by("line_no").values_list("level", flat=True))
    assert levels == ["warning", "debug", "error", ""]


def test_api_pages_by_cursor(viewer_client, replica):
    log_lines(batch(replica, [f"INFO line {i}" for i in range(1, 8)]))
    url = f"/api/v1/replicas/{replica.pk}/logs"
    first = viewer_client.get(url, {"limit": 3}).json()
    assert [line["line_no"] for line in first["lines"]] == [1, 2, 3]
    assert first["runs"] == ["gen1-run1"] and first["run"] == "gen1-run1"
    second = viewer_client.get(url, {"limit": 3, "after": first["next_cursor"]}).json()
    assert [line["text"] for line in second["lines"]] == [
        "INFO line 4",
        "INFO line 5",
        "INFO line 6",
    ]
    third = viewer_client.get(url, {"after": second["next_cursor"]}).json()
    assert [line["line_no"] for line in third["lines"]] == [7]
    empty = viewer_client.get(url, {"after": third["next_cursor"]}).json()
    assert empty["lines"] == [] and empty["next_cursor"] == third["next_cursor"]


def test_api_filters_and_runs(viewer_client, replica):
    log_lines(batch(replica, ["INFO boot", "ERROR oom", "INFO oom again"], run=1))
    log_lines(batch(replica, ["INFO second start"], run=2))
    url = f"/api/v1/replicas/{replica.pk}/logs"
    assert viewer_client.get(url).json()["runs"] == ["gen1-run2", "gen1-run1"]
    assert [x["text"] for x in viewer_client.get(url).json()["lines"]] == ["INFO second start"]
    old = viewer_client.get(url, {"run": "gen1-run1", "q": "OOM"}).json()
    assert [x["line_no"] for x in old["lines"]] == [2, 3]
    errors = viewer_client.get(url, {"run": "gen1-run1", "level": "error"}).json()
    assert [x["text"] for x in errors["lines"]] == ["ERROR oom"]


@pytest.mark.parametrize(
    ("params", "field"),
    [({"after": "abc"}, "after"), ({"run": "latest"}, "run"), ({"level": "loud"}, "level")],
)
def test_api_names_the_bad_field(viewer_client, replica, params, field):
    log_lines(batch(replica, ["x"]))
    response = viewer_client.get(f"/api/v1/replicas/{replica.pk}/logs", params)
    assert response.status_code == 422
    assert response.json()["field"] == field


def test_download_is_a_text_attachment(viewer_client, replica):
    log_lines(batch(replica, ["one", "two"]))
    response = viewer_client.get(f"/api/v1/replicas/{replica.pk}/logs/download")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert "attachment" in response["Content-Disposition"]
    assert b"".join(response.streaming_content) == b"one\ntwo\n"


def test_purge_keeps_the_last_lines_of_each_run(replica, monkeypatch):
    monkeypatch.setattr(services, "KEEP_LINES", 5)
    monkeypatch.setattr(services, "KEEP_BYTES", 10)
    log_lines(batch(replica, [f"line {i}" for i in range(1, 21)]))
    log_lines(batch(replica, ["short run"], run=2))
    assert purge() == 15
    assert [n for n, _ in stored(replica)] == [16, 17, 18, 19, 20]
    assert stored(replica, run=2) == [(1, "short run")]


def test_purge_keeps_up_to_the_byte_budget(replica, monkeypatch):
    monkeypatch.setattr(services, "KEEP_LINES", 2)
    monkeypatch.setattr(services, "KEEP_BYTES", 40)  # "line NN\n" = 8 bytes: 5 lines fit
    log_lines(batch(replica, [f"line {i}" for i in range(10, 30)]))
    purge()
    assert [n for n, _ in stored(replica)] == [16, 17, 18, 19, 20]


def test_page_renders_and_the_poll_returns_only_new_lines(viewer_client, replica):
    log_lines(batch(replica, ["INFO up", "ERROR boom", "INFO after"]))
    page = viewer_client.get(f"/replicas/{replica.pk}/logs/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'class="lvl-error">ERROR boom' in html
    assert 'data-testid="first-error"' in html and "start=2#L2" in html
    assert "every 1s" in html and "after=3" in html
    log_lines(batch(replica, ["INFO fresh"], first=4))
    poll = viewer_client.get(
        f"/replicas/{replica.pk}/logs/", {"after": "3", "run": "gen1-run1"}, HTTP_HX_REQUEST="true"
    )
    body = poll.content.decode()
    assert "INFO fresh" in body and "ERROR boom" not in body
    assert "after=4" in body and 'hx-swap-oob="beforeend:#log-lines"' in body
    again = viewer_client.get(
        f"/replicas/{replica.pk}/logs/", {"after": "4", "run": "gen1-run1"}, HTTP_HX_REQUEST="true"
    )
    assert "hx-swap-oob" not in again.content.decode()


def test_page_links_the_previous_restart(viewer_client, replica):
    log_lines(batch(replica, ["old"], run=1))
    log_lines(batch(replica, ["new"], run=2))
    html = viewer_client.get(f"/replicas/{replica.pk}/logs/").content.decode()
    assert "?run=gen1-run1" in html and "new" in html
    older = viewer_client.get(f"/replicas/{replica.pk}/logs/", {"run": "gen1-run1"})
    assert ">old</span>" in older.content.decode()


def test_page_of_a_replica_without_lines(viewer_client, replica):
    assert viewer_client.get(f"/replicas/{replica.pk}/logs/").status_code == 200
