from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "console.gateway"
    label = "gateway"
    verbose_name = "OpenAI-compatible gateway"
