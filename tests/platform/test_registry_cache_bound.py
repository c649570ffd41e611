"""The registry cache's bound on staleness, checked on its own clock: a replica that missed an invalidation (its
link to Redis hangs, so neither the message nor its own heartbeats come back) serves the old entry at most the
design bound (about 1 s: `trust_s` after its last heartbeat was sent, plus one request) after the invalidation,
however long the TTL. The clock is driven by the test, so the bound is exact and nothing sleeps for it; the
replica-level tests (test_platform_staleness.py) only check that it is honoured eventually."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from loraplex.platform.storage.cache import LocalCache, RegistryCache
from loraplex.platform.storage.redis_link import RedisLink
from tests.platform.helpers import REDIS_URL

DESIGN_BOUND_S = 1.0  # what a deletion or revocation may take to be honoured by every replica (docs, module docs)
CACHE_TTL_S = 3600.0  # far beyond the bound: only the trust window can end the stale entry in time


class DrivenClock:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Source:
    """What the database holds for the key, and how often the cache read it."""

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value
        self.loads = 0

    async def load(self) -> dict[str, Any]:
        self.loads += 1
        return dict(self.value)


@pytest.mark.services
async def test_a_missed_invalidation_is_served_at_most_the_design_bound_after_it() -> None:
    clock = DrivenClock(1000.0)
    cache = RegistryCache(CACHE_TTL_S, RedisLink(REDIS_URL), clock=clock)  # the defaults the app runs with
    other = RegistryCache(CACHE_TTL_S, RedisLink(REDIS_URL))  # another replica: it makes the change
    key = f"adapter:{uuid.uuid4()}:bound"
    source = Source({"v": "version-1"})
    try:
        await cache.start()  # its heartbeats, all sent at clock 1000.0, come back: L1 and L2 are trusted
        assert cache.trusted()
        assert await cache.get_or_load(key, source.load) == {"v": "version-1"} and source.loads == 1
        assert await cache.get_or_load(key, source.load) == {"v": "version-1"} and source.loads == 1  # cached

        # Its Redis link hangs: no heartbeat or invalidation message reaches it from now on.
        await cache.close()
        # At that very instant (the worst case: right after its last heartbeat was sent), the record changes
        # and the other replica invalidates it; the message is published but this replica never hears it.
        source.value = {"v": "version-2"}
        await other.invalidate(key)
        invalidated_at = clock.now
        assert await cache.get_or_load(key, source.load) == {"v": "version-1"}  # stale, within the bound

        clock.now = invalidated_at + DESIGN_BOUND_S
        assert await cache.get_or_load(key, source.load) == {"v": "version-2"}
        assert source.loads == 2
    finally:
        for c in (cache, other):
            await c.close()
            assert c.redis is not None
            await c.redis.close()


def test_an_entry_expires_after_its_ttl_on_the_cache_clock() -> None:
    clock = DrivenClock(50.0)
    local = LocalCache(ttl_s=60.0, clock=clock)
    local.put("k", "v", local.version("k"))
    clock.now = 50.0 + 59.9
    assert local.get("k") == "v"
    clock.now = 50.0 + 60.1
    assert local.get("k") is None
