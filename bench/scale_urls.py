"""The console's URLs plus `/bench/trivial`: the cheapest view Django serves through the same
middleware (session, signed-in user, CSRF, security headers) — the yardstick of
bench/page_latency.py."""

from django.http import HttpResponse
from django.urls import include, path


def trivial(request) -> HttpResponse:
    return HttpResponse(f"ok {request.user.username}", content_type="text/plain")


urlpatterns = [
    path("bench/trivial", trivial),
    path("", include("console.urls")),
]
