"""What the gateway tests share besides the kit (the fake engine is tests/kit/fake_engine.py;
the real-engine gateway tests are in tests/engine/test_gateway_e2e.py)."""

from __future__ import annotations

from console.gateway import usage
from console.gateway.models import Usage
from tests.kit import wait_for


def counted(token, model: str, requests: int) -> Usage:
    """The usage row once `requests` were counted (counting runs after the answer is sent)."""

    def row():
        usage.flush()
        return Usage.objects.filter(token=token, model=model, requests__gte=requests).first()

    return wait_for(row, 10, message=f"{requests} requests counted")
