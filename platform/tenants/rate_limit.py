"""Per-tenant request-rate limits: fixed one-minute windows, counted in Redis (shared by all replicas)
or, without Redis or while it is unreachable, in this process."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loraplex.platform.storage.redis_link import RedisLink

WINDOW_S = 60
_KEY = "loraplex:ratelimit:"


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int
    retry_after_s: int  # seconds until the window resets


class RateLimiter:
    def __init__(self, redis: RedisLink | None = None, clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.clock = clock  # seconds since the epoch; tests fix it so no window ends mid-test
        self._local: dict[str, tuple[int, int]] = {}  # tenant -> (window, count)

    async def hit(self, tenant_id: str, limit_per_minute: int, now: float | None = None) -> RateDecision:
        """Count one request of `tenant_id`; a limit <= 0 means unlimited."""
        if limit_per_minute <= 0:
            return RateDecision(True, 0, 0, 0)
        now = self.clock() if now is None else now
        window = int(now // WINDOW_S)
        reset = max(1, math.ceil((window + 1) * WINDOW_S - now))
        count = await self._count_redis(tenant_id, window) if self.redis is not None else None
        if count is None:
            count = self._count_local(tenant_id, window)
        return RateDecision(count <= limit_per_minute, limit_per_minute, max(0, limit_per_minute - count), reset)

    async def _count_redis(self, tenant_id: str, window: int) -> int | None:
        key = f"{_KEY}{tenant_id}:{window}"

        async def incr(r: Any) -> list[Any]:
            async with r.pipeline(transaction=True) as pipe:
                pipe.incr(key)
                pipe.expire(key, WINDOW_S * 2)
                return await pipe.execute()

        result = await self.redis.call(incr) if self.redis is not None else None
        return int(result[0]) if result is not None else None

    def _count_local(self, tenant_id: str, window: int) -> int:
        seen_window, count = self._local.get(tenant_id, (window, 0))
        count = count + 1 if seen_window == window else 1
        self._local[tenant_id] = (window, count)
        return count
