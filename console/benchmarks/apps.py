from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    name = "console.benchmarks"
    label = "benchmarks"
    verbose_name = "Benchmark runs against deployments"
