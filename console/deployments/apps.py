from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "console.deployments"
    label = "deployments"
    verbose_name = "Deployments: models served by vLLM engines"
