"""ASGI entry point (uvicorn console.asgi:application)."""

from django.core.asgi import get_asgi_application

from console.boot import setup_django

setup_django()
application = get_asgi_application()
