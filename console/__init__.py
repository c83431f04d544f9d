"""NPU Console: the Django project (web, API, console-side Celery)."""

__version__ = "0.1.0"
