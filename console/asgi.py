"""ASGI entry point (uvicorn console.asgi:application).

`/v1/…` goes to the OpenAI-compatible gateway (console/gateway/app.py, a Starlette app:
streaming relays without Django's synchronous middleware in the path); everything else,
pages and `/api/v1`, to Django.
"""

from django.core.asgi import get_asgi_application

from console.boot import setup_django

setup_django()
django_application = get_asgi_application()

from console.gateway.app import app as gateway_application  # noqa: E402 - needs Django set up


async def application(scope, receive, send) -> None:
    if scope["type"] == "lifespan" or (
        scope["type"] == "http" and (scope["path"] == "/v1" or scope["path"].startswith("/v1/"))
    ):
        await gateway_application(scope, receive, send)
        return
    await django_application(scope, receive, send)
