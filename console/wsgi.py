"""WSGI entry point, for servers that prefer it."""

from django.core.wsgi import get_wsgi_application

from console.boot import setup_django

setup_django()
application = get_wsgi_application()
