"""Template filters for diagnosis pages."""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

register = template.Library()
_CODE = re.compile(r"`([^`]+)`")


@register.filter
def codespans(text: str) -> str:
    """Escape `text`, then show its `backticked` parts as <code> (remediation commands)."""
    return mark_safe(_CODE.sub(r"<code>\1</code>", escape(text)))  # noqa: S308 - escaped above


@register.filter
def severity_badge(severity: str) -> str:
    """The badge modifier for a rule severity."""
    return {"critical": "crit", "warning": "warn"}.get(severity, "info")
