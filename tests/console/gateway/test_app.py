"""The gateway's start-up (console/gateway/app.py's lifespan): what it does once so that no
request pays for it later."""

from __future__ import annotations

import asyncio
import gc
import time

from console.gateway.app import app


def test_start_up_objects_are_frozen_out_of_every_full_collection():
    """The ~100,000 objects start-up leaves (Django, the URL conf, the rules) are moved out of
    the collector's reach: a full collection no longer walks them while requests wait."""

    def full_collection_ms() -> float:
        began = time.perf_counter()
        gc.collect()
        return (time.perf_counter() - began) * 1000

    gc.unfreeze()  # a test before may have run the lifespan (conftest unfreezes after each)

    async def body():
        before = full_collection_ms()
        async with app.router.lifespan_context(app):
            return before, gc.get_freeze_count(), full_collection_ms()

    before, frozen, after = asyncio.run(body())
    assert frozen > 50_000
    assert after < before / 3
