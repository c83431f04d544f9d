from django.urls import include, path

from console.diagnosis import views

urlpatterns = [
    path("diagnose/", views.diagnose_page, name="diagnose"),
    path("diagnose/rules/", views.rules_page, name="diagnosis-rules"),
    path("", include("console.diagnosis.incident_urls")),
    path("", include("console.diagnosis.webhook_urls")),
]
