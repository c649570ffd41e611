"""One Redis connection pool shared by the registry cache and the rate limiter, with health tracking.

Redis is an accelerator, never a dependency of correctness: every call goes through `call`, which
turns a connection failure into `None` (the caller falls back to SQL / local state), logs one
warning per outage, and skips Redis entirely for a short back-off so a dead server does not add a
timeout to every request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from loraplex.platform.background import cancelling

log = logging.getLogger("loraplex.platform.redis")
T = TypeVar("T")

RETRY_AFTER_S = 2.0


class RedisLink:
    def __init__(self, url: str, *, timeout_s: float = 0.5) -> None:
        self.url = url
        self.client: aioredis.Redis = aioredis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, health_check_interval=10
        )
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._on_recover: list[Callable[[], Awaitable[None]]] = []

    @property
    def healthy(self) -> bool:
        return self._down_since is None

    def available(self) -> bool:
        """False while inside the back-off window after a failure."""
        return self._down_since is None or time.monotonic() >= self._retry_at

    def on_recover(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run `callback` when Redis answers again after an outage (e.g. to drop what may be stale)."""
        self._on_recover.append(callback)

    def mark_down(self, exc: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning(
                "Redis at %s unavailable (%s: %s); falling back to the database and local state",
                self.url,
                type(exc).__name__,
                exc,
            )
        self._retry_at = time.monotonic() + RETRY_AFTER_S

    async def mark_up(self) -> None:
        if self._down_since is not None:
            log.warning("Redis at %s is back after %.1fs", self.url, time.monotonic() - self._down_since)
            self._down_since = None
            for callback in self._on_recover:
                try:
                    await callback()
                except RedisError as exc:
                    self.mark_down(exc)
                    return

    async def call(self, fn: Callable[[aioredis.Redis], Awaitable[T]]) -> T | None:
        """`await fn(client)`, or None when Redis is down (the failure is logged once per outage)."""
        if not self.available():
            return None
        try:
            result = await fn(self.client)
        except (RedisError, OSError) as exc:
            if cancelling():  # our own cancellation, turned into a timeout inside redis-py: not an outage
                raise asyncio.CancelledError from exc
            self.mark_down(exc)
            return None
        await self.mark_up()
        return result

    async def ping(self) -> bool:
        return bool(await self.call(lambda r: r.ping()))

    async def close(self) -> None:
        await self.client.aclose()

    def pubsub(self) -> Any:
        return self.client.pubsub(ignore_subscribe_messages=True)
