from django.urls import path

from console.telemetry import views

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
]
