from django.apps import AppConfig


class LogsConfig(AppConfig):
    name = "console.logs"
    label = "logs"
    verbose_name = "Engine logs shipped from the hosts"
