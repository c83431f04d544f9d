"""Template filters for what list pages render once per row (a builtin library: no {% load %}).

A fleet page renders 50 rows, and the Django template engine's per-row cost is what made those
pages slow (docs/scale.md): a status include was ~7 us a row, `{% url %}` ~35 us, `|date` ~50 us.
These filters do the same work in one Python call each:

- `status_badge`, `replica_badge`, `agent_skew_badge`: colour always comes with the word;
- `time_tag`: `<time datetime="ISO">YYYY-MM-DD HH:MM:SS</time>` in the current time zone;
- `label_badges`: a node's labels as `key=value` badges;
- `gb_size`: a memory figure in GB, in TB from 1,024 GB (a fleet's NPU memory is hundreds of TB);
- `url_for`: `{{ obj.name|url_for:"node-detail" }}` is `{% url "node-detail" obj.name %}`, with
  the URL pattern reversed once (per URLconf and script prefix) and the argument quoted as
  `reverse` quotes it.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime
from urllib.parse import quote

from django import template
from django.urls import get_resolver, get_script_prefix, get_urlconf, reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

_STATUS_KIND = {
    "online": "ok",
    "OK": "ok",
    "draining": "warn",
    "maintenance": "warn",
    "Warning": "warn",
    "Alarm": "crit",
    "Critical": "crit",
}
_REPLICA_KIND = {
    "ready": "ok",
    "pending": "info",
    "scheduled": "info",
    "starting": "info",
    "loading": "info",
    "stopping": "info",
    "draining": "info",
    "unhealthy": "warn",
    "unknown": "warn",
    "failed": "crit",
    "crash-loop": "crit",
}
_SKEW = {
    "behind": (
        "warn",
        "agent behind",
        "Agent {v} is one minor version behind this console: supported, upgrade it "
        "(docs/operations.md)",
    ),
    "unsupported": (
        "crit",
        "agent unsupported",
        "Agent {v} is not supported by this console: console X.Y supports agents X.Y and "
        "X.Y-1 (docs/operations.md)",
    ),
}


def _badge(kind: str, text: str) -> SafeString:
    return mark_safe(f'<span class="badge badge--{kind}">{escape(text)}</span>')  # noqa: S308


@register.filter
def status_badge(value: str | None) -> SafeString:
    """A node status or an NPU health word as a badge."""
    return _badge(_STATUS_KIND.get(value or "", "unknown"), value or "unknown")


@register.filter
def replica_badge(value: str) -> SafeString:
    """A replica state as a badge."""
    return _badge(_REPLICA_KIND.get(value, "unknown"), value)


@register.filter
def agent_skew_badge(agent_version: str | None) -> SafeString:
    """A badge when an agent of this version is behind or outside this console's version-skew
    policy (inventory.models.agent_skew), else ''."""
    from console import __version__
    from console.inventory.models import agent_skew

    skew = _SKEW.get(str(agent_skew(agent_version or "", __version__)))
    if skew is None:
        return mark_safe("")
    kind, text, title = skew
    return mark_safe(  # noqa: S308 - the version is escaped
        f' <span class="badge badge--{kind}" data-testid="agent-skew" '
        f'title="{escape(title.format(v=agent_version))}">{text}</span>'
    )


@register.filter
def time_tag(value: datetime | None, empty: str = "never") -> SafeString:
    """`<time>` with the ISO instant and a `Y-m-d H:i:s` local reading, or `empty`."""
    if value is None:
        return escape(empty)
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    return mark_safe(  # noqa: S308 - both parts are formatted datetimes
        f'<time datetime="{local.isoformat()}">{local.strftime("%Y-%m-%d %H:%M:%S")}</time>'
    )


@register.filter
def label_badges(labels: dict | None) -> SafeString:
    """A node's labels as `key=value` badges separated by spaces."""
    return mark_safe(  # noqa: S308 - keys and values are escaped
        "".join(
            f'<span class="badge badge--info">{escape(k)}={escape(v)}</span> '
            for k, v in (labels or {}).items()
        )
    )


@register.filter
def gb_size(gb: float | None) -> str:
    """`812.5 GB`, or `500.0 TB` from 1,024 GB on; `–` for no figure."""
    if gb is None:
        return "–"
    return f"{gb / 1024:,.1f} TB" if gb >= 1024 else f"{gb:,.1f} GB"


_MARK = "9876543210"  # matches the int, slug and str converters' patterns
# the characters django.urls.reverse leaves unquoted in a path argument
_SAFE = "!$&'()*+,;=/~:@"


@functools.cache
def _pattern(viewname: str, urlconf: str | None, prefix: str) -> tuple[str, str, re.Pattern] | None:
    """(text before the argument, text after it, the argument's converter pattern), or None
    when the view is not a plain one-argument pattern (then `reverse` does it all)."""
    entries = get_resolver(urlconf).reverse_dict.getlist(viewname)
    if len(entries) != 1 or len(entries[0][3]) != 1:
        return None
    (converter,) = entries[0][3].values()
    url = reverse(viewname, args=[_MARK], urlconf=urlconf)
    if url.count(_MARK) != 1:
        return None
    head, _, tail = url.partition(_MARK)
    return head, tail, re.compile(converter.regex)


@register.filter
def url_for(arg: object, viewname: str) -> str:
    """The URL of `viewname` for `arg`: what `{% url viewname arg %}` gives, and the same
    NoReverseMatch for an argument its converter refuses."""
    pattern = _pattern(viewname, get_urlconf(), get_script_prefix())
    text = str(arg)
    if pattern is None or not pattern[2].fullmatch(text):
        return reverse(viewname, args=[arg])
    head, tail, _ = pattern
    return head + quote(text, safe=_SAFE) + tail
