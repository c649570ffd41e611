"""Read-through registry cache: an in-process LRU (L1) in front of Redis (L2, optional) in front of SQL.

Correctness across replicas rests on two mechanisms:

* Invalidation bumps a per-key version (locally, and with INCR in Redis) and is broadcast over
  Redis pub/sub; every replica drops its L1 entry when the message arrives.
* A value read from SQL is only stored if no invalidation happened while it was being read
  (the version seen before the read must still be current), so a slow reader can never put a
  stale record back after a delete. Redis entries carry the version they were read under and
  are ignored when it no longer matches.

While Redis is unreachable, invalidations from other replicas cannot arrive, so L1 is bypassed
and every lookup goes to SQL; when Redis comes back L1 is cleared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from loraplex.platform.services.redis_link import RedisLink

log = logging.getLogger("loraplex.platform.cache")

CHANNEL = "loraplex:registry:invalidate"
_ENTRY = "loraplex:registry:entry:"
_VERSION = "loraplex:registry:version:"

Loader = Callable[[], Awaitable[Any | None]]


class LocalCache:
    """Bounded LRU with TTL and per-key invalidation versions (one process)."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, int, Any]] = OrderedDict()
        self._versions: dict[str, int] = {}

    def version(self, key: str) -> int:
        return self._versions.get(key, 0)

    def get(self, key: str) -> Any | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        expires, version, value = hit
        if expires < time.monotonic() or version != self.version(key):
            self._entries.pop(key, None)
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: Any, version: int) -> None:
        if version != self.version(key):
            return  # invalidated while the value was being loaded
        self._entries[key] = (time.monotonic() + self.ttl_s, version, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def invalidate(self, key: str) -> None:
        self._versions[key] = self.version(key) + 1
        self._entries.pop(key, None)
        if len(self._versions) > 4 * self.max_entries:
            # Old versions only matter for loads in flight; dropping them can only cause a miss.
            for stale in list(self._versions)[: len(self._versions) // 2]:
                self._versions.pop(stale, None)

    def clear(self) -> None:
        for key in list(self._entries):
            self.invalidate(key)


class RegistryCache:
    """`get_or_load(key, loader)` and `invalidate(key)`; values must be JSON-serialisable."""

    def __init__(self, ttl_s: float = 60.0, redis: RedisLink | None = None) -> None:
        self.local = LocalCache(ttl_s)
        self.redis = redis
        self.ttl_s = ttl_s
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._watchers: list[tuple[str, Callable[[str], None]]] = []
        if redis is not None:
            redis.on_recover(self._after_outage)

    async def start(self) -> None:
        if self.redis is not None and self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="registry-invalidation-listener")
            # Wait briefly for the subscription so invalidations are not missed right after start.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._subscribed.wait(), timeout=2.0)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None

    def on_invalidate(self, prefix: str, callback: Callable[[str], None]) -> None:
        """Call ``callback(rest of the key)`` whenever a key starting with ``prefix`` is invalidated, here or
        (through Redis) on another replica; our own invalidations may arrive a second time that way."""
        self._watchers.append((prefix, callback))

    def _notify(self, key: str) -> None:
        for prefix, callback in self._watchers:
            if key.startswith(prefix):
                try:
                    callback(key[len(prefix) :])
                except Exception:  # a watcher's failure must not stop invalidation
                    log.exception("invalidation watcher for %r failed on %r", prefix, key)

    def _use_local(self) -> bool:
        # Without Redis this process is the only writer; with Redis, L1 is safe only while subscribed.
        return self.redis is None or (self._subscribed.is_set() and self.redis.healthy)

    async def get_or_load(self, key: str, loader: Loader) -> Any | None:
        if self._use_local():
            value = self.local.get(key)
            if value is not None:
                return value
        local_version = self.local.version(key)
        remote_version: bytes | None = None
        if self.redis is not None:
            got = await self.redis.call(lambda r: r.mget(_ENTRY + key, _VERSION + key))
            if got is not None:
                raw, remote_version = got
                if raw is not None:
                    entry = json.loads(raw)
                    if str(entry.get("v")) == _text(remote_version):
                        if self._use_local():
                            self.local.put(key, entry["value"], local_version)
                        return entry["value"]
        value = await loader()
        if value is None:
            return None
        if self.redis is not None:
            payload = json.dumps({"v": _text(remote_version), "value": value})
            await self.redis.call(lambda r: r.set(_ENTRY + key, payload, ex=max(1, int(self.ttl_s))))
        if self._use_local():
            self.local.put(key, value, local_version)
        return value

    async def invalidate(self, key: str) -> None:
        """Drop `key` here, in Redis and (via pub/sub) on every other replica."""
        self.local.invalidate(key)
        self._notify(key)
        if self.redis is None:
            return

        async def bump(r: Any) -> list[Any]:
            async with r.pipeline(transaction=True) as pipe:
                pipe.incr(_VERSION + key)
                pipe.expire(_VERSION + key, max(60, int(self.ttl_s * 10)))
                pipe.delete(_ENTRY + key)
                pipe.publish(CHANNEL, key)
                return await pipe.execute()

        await self.redis.call(bump)

    async def _after_outage(self) -> None:
        # Invalidations may have been missed while Redis was away.
        self.local.clear()

    async def _listen(self) -> None:
        assert self.redis is not None
        delay = 0.2
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(CHANNEL)
                self.local.clear()  # anything cached before (re)subscribing may have missed a message
                self._subscribed.set()
                await self.redis.mark_up()
                delay = 0.2
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        key = _text(message["data"])
                        self.local.invalidate(key)
                        self._notify(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost: fall back to SQL until resubscribed
                self._subscribed.clear()
                self.redis.mark_down(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


def _text(value: bytes | str | None) -> str:
    if value is None:
        return "0"
    return value.decode() if isinstance(value, bytes) else str(value)
