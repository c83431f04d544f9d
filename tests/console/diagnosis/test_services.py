"""decode_log: a log file reads as the text it was saved as, whatever the saving tool's encoding."""

from __future__ import annotations

import codecs
import io
import json

import pytest
from django.core.management import call_command

from console.diagnosis import services
from console.diagnosis.matcher import diagnose
from console.diagnosis.services import MAX_TEXT_BYTES, decode_log, excerpt
from tests.console.diagnosis.samples import log_text, resolve

# Chinese reporters paste this shape ("the error is as follows:"), tests/fixtures/corpus
TEXT = "报错如下：\nRuntimeError: NPU out of memory. Tried to allocate 2.00 GiB — 显存不足\n"


@pytest.mark.parametrize(
    "data",
    [
        TEXT.encode("utf-8"),
        codecs.BOM_UTF8 + TEXT.encode("utf-8"),
        TEXT.encode("utf-16"),  # with its byte-order mark: PowerShell's `>`
        TEXT.encode("utf-16-le"),
        TEXT.encode("utf-16-be"),
        TEXT.encode("utf-32"),
        TEXT.encode("gb18030"),  # a Chinese-locale terminal or Windows
    ],
    ids=["utf-8", "utf-8-bom", "utf-16-bom", "utf-16-le", "utf-16-be", "utf-32", "gbk"],
)
def test_each_encoding_reads_back_as_the_text(data):
    assert decode_log(data) == TEXT


def test_utf8_with_a_few_unreadable_bytes_stays_utf8():
    cut = TEXT.encode("utf-8")[:-5]  # cut inside 足
    assert decode_log(cut) == TEXT[:-3] + "\ufffd"
    stray = TEXT.encode("utf-8") + b"\xff binary junk\n"
    assert decode_log(stray).startswith(TEXT) and "\ufffd binary junk" in decode_log(stray)


def test_bytes_no_encoding_reads_are_replaced_not_refused():
    assert (
        decode_log(b"ERROR engine failed \xff\x80\x80\n")
        == "ERROR engine failed \ufffd\ufffd\ufffd\n"
    )


def test_the_command_reads_a_powershell_log_as_its_text(tmp_path):
    text = log_text(resolve("err-oom-npu-out-of-memory-v071.txt"))
    expected = [d.as_dict() for d in diagnose(text)]
    assert expected
    saved = tmp_path / "engine.log"
    saved.write_bytes(text.encode("utf-16"))
    out = io.StringIO()
    call_command("diagnose", str(saved), "--json", stdout=out)
    assert json.loads(out.getvalue()) == expected


def test_the_page_reads_an_uploaded_gbk_log(viewer_client):
    upload = io.BytesIO("报错：OSError: [Errno 98] Address already in use\n".encode("gbk"))
    upload.name = "engine.log"
    resp = viewer_client.post("/diagnose/", {"file": upload}, headers={"HX-Request": "true"})
    assert resp.status_code == 200
    page = resp.content.decode()
    assert 'data-rule="' in page and "port-in-use" in page
    assert "报错：OSError: [Errno 98]" in page  # the evidence line as written, not mojibake


def _big_log() -> str:
    """Six MB: a version warning first, noise, the cause near the end."""
    head = "WARNING 05-01 10:00:00 [platform.py:1] vllm-ascend 0.9.1 on CANN 8.1.RC1\n"
    noise = "INFO 05-01 10:00:01 [metrics.py:2] Avg prompt throughput: 1.0 tokens/s\n"
    cause = "OSError: [Errno 98] Address already in use\n"
    return head + noise * (6 * 2**20 // len(noise)) + cause + noise * 20


def test_a_log_over_the_limit_keeps_its_first_and_last_lines():
    text = _big_log()
    kept, note = excerpt(text)
    assert len(kept.encode()) <= MAX_TEXT_BYTES
    assert kept.startswith(text.splitlines(keepends=True)[0]) and kept.endswith(text[-5000:])
    gap = text.count("\n") - kept.count("\n") + 1
    assert f"[… {gap:,} lines left out" in kept
    assert note.startswith("The log is 6.0 MB: read its first 1.0 MB") and f"{gap:,} lines" in note
    assert all(len(line) < 200 for line in kept.splitlines())  # cut at line ends
    assert excerpt("short\n") == ("short\n", None)


def test_the_command_diagnoses_a_big_file_and_says_what_it_left_out(tmp_path):
    saved = tmp_path / "engine.log"
    saved.write_text(_big_log())
    out, err = io.StringIO(), io.StringIO()
    call_command("diagnose", str(saved), "--json", stdout=out, stderr=err)
    assert json.loads(out.getvalue())[0]["rule"] == "port-in-use"
    assert "lines between them were left out" in err.getvalue()


def test_the_page_reads_a_big_upload_and_says_what_it_left_out(viewer_client):
    upload = io.BytesIO(_big_log().encode())
    upload.name = "engine.log"
    resp = viewer_client.post("/diagnose/", {"file": upload}, headers={"HX-Request": "true"})
    page = resp.content.decode()
    assert 'data-rule="port-in-use"' in page
    assert 'data-note="excerpt"' in page and "lines between them were left out" in page


def test_the_page_refuses_an_upload_over_its_limit(viewer_client, monkeypatch):
    monkeypatch.setattr(services, "MAX_UPLOAD_BYTES", 1024)
    upload = io.BytesIO(b"x" * 1025)
    upload.name = "engine.log"
    resp = viewer_client.post("/diagnose/", {"file": upload})
    assert resp.context["error_field"] == "text" and "larger than 32 MB" in resp.context["error"]
