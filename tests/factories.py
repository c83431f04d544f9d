"""The row factories live in the test kit (tests/kit/factories.py); this module re-exports
them for the imports that still name it (tests/README.md)."""

from __future__ import annotations

from tests.kit.factories import make_deployment, make_node, make_replica

__all__ = ["make_deployment", "make_node", "make_replica"]
