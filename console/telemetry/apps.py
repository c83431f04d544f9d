from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "console.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry: samples, rollups, Prometheus"
