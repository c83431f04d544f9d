"""Content-Security-Policy on every response: scripts and styles from the console only.

No 'unsafe-inline', no 'unsafe-eval': templates carry no inline <script>, no on*=""
handlers, no style="" attributes and no htmx trigger filters (which htmx evaluates with
Function()); behaviour lives in static/js, styles in static/css. htmx's own indicator
<style> is turned off by the htmx-config meta tag in templates/base.html.

The policy is `settings.SECURE_CSP`, shaped like Django 6's setting of that name, so the
upgrade can swap this middleware for django.middleware.csp.ContentSecurityPolicyMiddleware.
A response that already carries a policy keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

HEADER = "Content-Security-Policy"


def build_policy(directives: Mapping[str, Sequence[str] | str | bool]) -> str:
    """`{"script-src": ["'self'"], "upgrade-insecure-requests": True}` -> header value."""
    parts = []
    for name, value in directives.items():
        if value is True:
            parts.append(name)
        elif value:
            sources = [value] if isinstance(value, str) else list(value)
            parts.append(" ".join([name, *sources]))
    return "; ".join(parts)


class ContentSecurityPolicyMiddleware(MiddlewareMixin):  # sync and async capable
    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        policy = build_policy(settings.SECURE_CSP)
        if policy and HEADER not in response:
            response[HEADER] = policy
        return response
