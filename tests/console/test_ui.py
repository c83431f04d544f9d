"""Badge filters: the word always shown, the colour class from the value, markup escaped."""

from __future__ import annotations

from django.template import engines

from console import __version__
from console.ui import (
    agent_skew_badge,
    gb_size,
    label_badges,
    replica_badge,
    status_badge,
    time_tag,
    url_for,
)


def test_status_words_get_their_colour_and_unknown_values_the_neutral_one():
    assert status_badge("online") == '<span class="badge badge--ok">online</span>'
    assert status_badge("Warning") == '<span class="badge badge--warn">Warning</span>'
    assert status_badge("Critical") == '<span class="badge badge--crit">Critical</span>'
    assert status_badge("") == '<span class="badge badge--unknown">unknown</span>'
    assert status_badge("<b>") == '<span class="badge badge--unknown">&lt;b&gt;</span>'


def test_replica_states():
    assert 'badge--ok">ready<' in replica_badge("ready")
    assert 'badge--info">loading<' in replica_badge("loading")
    assert 'badge--crit">crash-loop<' in replica_badge("crash-loop")
    assert 'badge--unknown">stopped<' in replica_badge("stopped")


def test_agent_skew_badge_only_when_behind_or_unsupported_and_escapes_the_version():
    major, minor = (int(x) for x in __version__.split(".")[:2])
    assert agent_skew_badge(__version__) == ""
    assert agent_skew_badge("") == ""  # unknown: no agent has reported yet
    if minor:
        assert "agent behind" in agent_skew_badge(f"{major}.{minor - 1}.9")
    html = agent_skew_badge(f'{major + 1}.0"><script>')
    assert "agent unsupported" in html and "<script>" not in html and "&quot;&gt;" in html


def test_the_filters_are_builtin_in_every_template():
    tpl = engines["django"].from_string("{{ v|status_badge }}{{ r|replica_badge }}")
    assert tpl.render({"v": "online", "r": "failed"}) == (
        '<span class="badge badge--ok">online</span><span class="badge badge--crit">failed</span>'
    )


def test_time_tag_reads_in_the_current_time_zone_and_says_never_for_none():
    from datetime import UTC, datetime

    from django.utils import timezone

    at = datetime(2026, 12, 3, 4, 5, 6, tzinfo=UTC)
    assert time_tag(at) == ('<time datetime="2026-12-03T04:05:06+00:00">2026-12-03 04:05:06</time>')
    with timezone.override("Asia/Shanghai"):
        assert ">2026-12-03 12:05:06</time>" in time_tag(at)
    assert time_tag(None) == "never"


def test_label_badges_escape_keys_and_values():
    assert label_badges({"zone": "az1", "<k>": '"v"'}) == (
        '<span class="badge badge--info">zone=az1</span> '
        '<span class="badge badge--info">&lt;k&gt;=&quot;v&quot;</span> '
    )
    assert label_badges(None) == ""


def test_url_for_matches_reverse_and_refuses_what_reverse_refuses():
    import pytest
    from django.urls import NoReverseMatch, reverse

    for view, arg in [("node-detail", "n-001"), ("incident-detail", 12), ("incident-ack", 7)]:
        assert url_for(arg, view) == reverse(view, args=[arg])
    with pytest.raises(NoReverseMatch):
        url_for("a.b/c", "node-detail")  # not a slug
    with pytest.raises(NoReverseMatch):
        url_for("x", "incident-detail")  # not an int


def test_memory_figures_read_in_gb_then_tb():
    assert gb_size(812.54) == "812.5 GB"
    assert gb_size(1023.9) == "1,023.9 GB"
    assert gb_size(512_000.0) == "500.0 TB"
    assert gb_size(None) == "–"
