"""ASGI entry point (uvicorn console.asgi:application).

`/v1/…` (and the engine routes outside it: /tokenize, /detokenize, /v2/rerank, …) goes to
the OpenAI-compatible gateway (console/gateway/app.py, a Starlette app:
streaming relays without Django's synchronous middleware in the path); everything else,
pages and `/api/v1`, to Django.
"""

from django.core.asgi import get_asgi_application

from console.boot import setup_django

setup_django()
django_application = get_asgi_application()

from console.gateway.app import ROOT_PATHS  # noqa: E402 - needs Django set up
from console.gateway.app import app as gateway_application  # noqa: E402


def _gateway_path(path: str) -> bool:
    return path == "/v1" or path.startswith(("/v1/", "/v2/")) or path in ROOT_PATHS


async def application(scope, receive, send) -> None:
    if scope["type"] == "lifespan" or (scope["type"] == "http" and _gateway_path(scope["path"])):
        await gateway_application(scope, receive, send)
        return
    await django_application(scope, receive, send)
