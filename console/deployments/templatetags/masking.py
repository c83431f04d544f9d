"""Template filters for what viewers see of secrets (console/deployments/masking.py)."""

from __future__ import annotations

from django import template

from console.deployments.masking import redact_argv, shown_lines

register = template.Library()


@register.filter
def masked_argv(argv) -> list[str]:
    """An argv-like list with secret flags' values `***` (workers.engine.argv.redact_argv)."""
    return redact_argv([str(a) for a in argv or []])


@register.filter
def masked_lines(lines) -> list[str]:
    """Log lines with tokens, passwords and API keys `***` (shipper.mask_secrets)."""
    return shown_lines(lines)
