from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from console.api import api

handler500 = "console.outage.server_error"  # the database down -> 503, not a traceback
urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/docs", RedirectView.as_view(url="/api/v1/docs", permanent=False)),
    path("api/v1/", api.urls),
    path("", include("console.telemetry.urls")),
    path("", include("console.deployments.urls")),
    path("", include("console.diagnosis.urls")),
    path("", include("console.logs.urls")),
    path("", include("console.benchmarks.urls")),
    path("", include("console.gateway.urls")),
    path("", include("console.accounts.urls")),
    path("", include("console.inventory.urls")),
]
