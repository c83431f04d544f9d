"""NPU Console: the Django project (web, API, console-side Celery)."""

__version__ = "0.2.0"
