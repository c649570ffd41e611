"""Per-tenant serving limits: concurrent sequences, queued requests and tokens per minute, shared by every
replica through Redis, or counted in this process while Redis is not configured or not answering.

Definitions (all per tenant, 0 = unlimited):

* a *queued request* is a generation request admitted to the engine and not yet finished (waiting or running:
  the engine decides the order, so both count); ``max_queued_requests`` caps how many there are at once;
* its *sequences* are prompts * n; ``max_concurrent_sequences`` caps their sum over the queued requests;
* ``tokens_per_minute``: each request reserves prompt tokens + max_tokens of every sequence in the current
  one-minute window when it is admitted, and gives back what it did not use when it ends.

In Redis, each admitted request is one *lease*: a member of the tenant's sorted set scored with the time it
expires (Redis' own clock). The replica holding a lease pushes that time forward every ``ttl / 3`` seconds
while the request runs and removes it when the request ends; a replica that crashes stops refreshing, so its
leases expire within ``ttl`` seconds and their slots come back. Checks and reservations happen in one Lua
script: all of a request's reservations are made, or none. The tokens-per-minute window follows Redis' clock
too, unless ``TenantLimits.clock`` is given (tests fix it so no window ends mid-test).

While Redis is down, requests are admitted against this replica's own counts (each replica then enforces the
limits on its own traffic); a lease is released where it was taken. An outage longer than the TTL lets the
Redis leases of requests still running expire, so until those finish Redis counts fewer than run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from loraplex.platform.background import stop_task
from loraplex.platform.domain_errors import Invalid, RateLimited
from loraplex.platform.error_codes import ErrorCode
from loraplex.platform.settings import Settings
from loraplex.platform.storage.redis_link import RedisLink

log = logging.getLogger("loraplex.platform.limits")

WINDOW_S = 60
CONCURRENCY_RETRY_S = 1  # a slot frees when some request ends, which nobody can predict
_LEASES = "loraplex:leases:"
_TOKENS = "loraplex:tpm:"

# KEYS: leases, tokens. ARGV: member, sequences, tokens, max sequences, tokens per minute, max requests, ttl,
# the tokens window's time ('' for Redis' own). Returns {"ok", window, 0} or {limit name, current use, retry after
# seconds}.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local wnow = tonumber(ARGV[8]) or now
local seqs, tokens = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_seqs, tpm, max_reqs, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local used = 0
for _, m in ipairs(live) do used = used + tonumber(string.match(m, '|(%d+)$')) end
if max_reqs > 0 and #live + 1 > max_reqs then return {'max_queued_requests', #live, 0} end
if max_seqs > 0 and used + seqs > max_seqs then return {'max_concurrent_sequences', used, 0} end
local window = math.floor(wnow / 60)
local spent = 0
if tonumber(redis.call('HGET', KEYS[2], 'w') or '-1') == window then
  spent = tonumber(redis.call('HGET', KEYS[2], 'n') or '0')
else
  redis.call('HSET', KEYS[2], 'w', window, 'n', 0)
end
if tpm > 0 and spent + tokens > tpm then
  return {'tokens_per_minute', spent, math.max(1, math.ceil((window + 1) * 60 - wnow))}
end
redis.call('HINCRBY', KEYS[2], 'n', tokens)
redis.call('EXPIRE', KEYS[2], 120)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 1)
return {'ok', window, 0}
"""

# KEYS: leases, tokens. ARGV: member, window, unused tokens.
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
local unused = tonumber(ARGV[3])
if unused > 0 and tonumber(redis.call('HGET', KEYS[2], 'w') or '-1') == tonumber(ARGV[2]) then
  if redis.call('HINCRBY', KEYS[2], 'n', -unused) < 0 then redis.call('HSET', KEYS[2], 'n', 0) end
end
return 1
"""

# KEYS: one leases key per member. ARGV: ttl, then the members. Only leases still there are extended (XX).
_REFRESH = """
local t = redis.call('TIME')
local until_ = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', until_, ARGV[i + 1])
  redis.call('EXPIRE', key, math.ceil(tonumber(ARGV[1])) + 1)
end
return 1
"""

# KEYS: leases, tokens. ARGV: the tokens window's time ('' for Redis' own). Returns {live requests, their
# sequences, tokens used or reserved this minute}.
_USAGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local wnow = tonumber(ARGV[1]) or now
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')
local used = 0
for _, m in ipairs(live) do used = used + tonumber(string.match(m, '|(%d+)$')) end
local spent = 0
if tonumber(redis.call('HGET', KEYS[2], 'w') or '-1') == math.floor(wnow / 60) then
  spent = tonumber(redis.call('HGET', KEYS[2], 'n') or '0')
end
return {#live, used, spent}
"""


@dataclass(frozen=True)
class TenantQuota:
    """A tenant's effective limits (its own, else the server's defaults); 0 is unlimited."""

    max_concurrent_sequences: int = 0
    tokens_per_minute: int = 0
    max_queued_requests: int = 0

    @property
    def unlimited(self) -> bool:
        return not (self.max_concurrent_sequences or self.tokens_per_minute or self.max_queued_requests)


@dataclass
class LimitsOf(Protocol):
    """A principal or a tenant row: the tenant's own limits (None: the server default)."""

    max_concurrent_sequences: int | None
    tokens_per_minute: int | None
    max_queued_requests: int | None


def tenant_quota(tenant: LimitsOf, settings: Settings) -> TenantQuota:
    """The tenant's own limits, else the server's defaults."""

    def pick(own: int | None, default: int) -> int:
        return default if own is None else own

    return TenantQuota(
        max_concurrent_sequences=pick(tenant.max_concurrent_sequences, settings.default_max_concurrent_sequences),
        tokens_per_minute=pick(tenant.tokens_per_minute, settings.default_tokens_per_minute),
        max_queued_requests=pick(tenant.max_queued_requests, settings.default_max_queued_requests),
    )


@dataclass
class Lease:
    """One admitted request's reservation; `release` is idempotent and never raises."""

    limits: TenantLimits | None
    tenant_id: str
    member: str
    sequences: int
    tokens: int
    window: int
    in_redis: bool
    released: bool = field(default=False)

    async def release(self, used_tokens: int = 0) -> None:
        """End the request: free its slots and give back the tokens it reserved but did not use."""
        if self.released:
            return
        self.released = True
        if self.limits is not None:
            await self.limits._release(self, max(0, self.tokens - max(0, used_tokens)))


class TenantLimits:
    def __init__(
        self, redis: RedisLink | None = None, *, ttl_s: float = 30.0, clock: Callable[[], float] | None = None
    ) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        # The tokens-per-minute window's clock (seconds since the epoch). None: Redis' own in Redis (one clock for
        # every replica), time.time in this process. Leases expire by Redis' clock whatever it is.
        self.clock = clock
        self.replica = uuid.uuid4().hex[:12]
        self._redis_leases: dict[str, str] = {}  # member -> leases key, for the heartbeat
        self._local: dict[str, dict[str, int]] = {}  # tenant -> member -> sequences
        self._local_tokens: dict[str, tuple[int, int]] = {}  # tenant -> (window, tokens reserved)
        self._heartbeat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.redis is not None and self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat(), name="tenant-limits-heartbeat")

    async def close(self) -> None:
        """Stop refreshing leases (any still held expire in Redis within the TTL)."""
        if self._heartbeat is not None:
            await stop_task(self._heartbeat)
            self._heartbeat = None

    # -- admission ---------------------------------------------------------------------------------

    async def admit(self, tenant_id: str, tenant_name: str, quota: TenantQuota, sequences: int, tokens: int) -> Lease:
        """Reserve a request of `sequences` sequences and `tokens` requested tokens, or raise the API error:
        400 when the request alone exceeds one of the tenant's limits, 429 with Retry-After when the tenant's
        current use leaves no room."""
        _refuse_never_fitting(tenant_name, quota, sequences, tokens)
        member = f"{self.replica}:{uuid.uuid4().hex}|{sequences}"
        if quota.unlimited:
            return Lease(None, tenant_id, member, sequences, tokens, 0, False)
        result = await self._admit_redis(tenant_id, member, quota, sequences, tokens) if self.redis else None
        in_redis = result is not None
        if result is None:
            result = self._admit_local(tenant_id, member, quota, sequences, tokens)
        verdict, value, retry = result
        if verdict != "ok":
            raise _over_limit(tenant_name, quota, verdict, value, sequences, tokens, retry)
        if in_redis:
            self._redis_leases[member] = _LEASES + tenant_id
        return Lease(self, tenant_id, member, sequences, tokens, value, in_redis)

    async def _admit_redis(
        self, tenant_id: str, member: str, quota: TenantQuota, sequences: int, tokens: int
    ) -> tuple[str, int, int] | None:
        assert self.redis is not None
        args: list[str | int | float] = [
            member,
            sequences,
            tokens,
            quota.max_concurrent_sequences,
            quota.tokens_per_minute,
            quota.max_queued_requests,
            self.ttl_s,
            self._window_time(),
        ]
        keys = [_LEASES + tenant_id, _TOKENS + tenant_id]
        reply = await self.redis.call(lambda r: r.eval(_ADMIT, 2, *keys, *args))
        if reply is None:
            return None
        verdict, value, retry = reply
        return (verdict.decode() if isinstance(verdict, bytes) else str(verdict)), int(value), int(retry)

    def _admit_local(
        self, tenant_id: str, member: str, quota: TenantQuota, sequences: int, tokens: int
    ) -> tuple[str, int, int]:
        live = self._local.setdefault(tenant_id, {})
        if quota.max_queued_requests and len(live) + 1 > quota.max_queued_requests:
            return "max_queued_requests", len(live), 0
        used = sum(live.values())
        if quota.max_concurrent_sequences and used + sequences > quota.max_concurrent_sequences:
            return "max_concurrent_sequences", used, 0
        now = self._now()
        window = int(now // WINDOW_S)
        seen, spent = self._local_tokens.get(tenant_id, (window, 0))
        spent = spent if seen == window else 0
        if quota.tokens_per_minute and spent + tokens > quota.tokens_per_minute:
            return "tokens_per_minute", spent, max(1, math.ceil((window + 1) * WINDOW_S - now))
        self._local_tokens[tenant_id] = (window, spent + tokens)
        live[member] = sequences
        return "ok", window, 0

    def _now(self) -> float:
        return (self.clock or time.time)()

    def _window_time(self) -> str:
        """The tokens window's time for the Lua scripts: '' (Redis' own clock) unless a clock was given."""
        return "" if self.clock is None else repr(self.clock())

    # -- release and heartbeat ---------------------------------------------------------------------

    async def _release(self, lease: Lease, unused_tokens: int) -> None:
        if lease.in_redis:
            self._redis_leases.pop(lease.member, None)
            keys = [_LEASES + lease.tenant_id, _TOKENS + lease.tenant_id]
            assert self.redis is not None
            # Unreachable Redis: the lease expires there within the TTL (no heartbeat refreshes it any more).
            await self.redis.call(lambda r: r.eval(_RELEASE, 2, *keys, lease.member, lease.window, unused_tokens))
            return
        live = self._local.get(lease.tenant_id, {})
        live.pop(lease.member, None)
        if not live:
            self._local.pop(lease.tenant_id, None)
        window, spent = self._local_tokens.get(lease.tenant_id, (None, 0))
        if window == lease.window and unused_tokens:
            self._local_tokens[lease.tenant_id] = (window, max(0, spent - unused_tokens))

    async def refresh(self) -> None:
        """Extend every lease this replica holds in Redis by the TTL (what the heartbeat does)."""
        if not self._redis_leases or self.redis is None:
            return
        members = list(self._redis_leases)
        keys = [self._redis_leases[m] for m in members]
        await self.redis.call(lambda r: r.eval(_REFRESH, len(keys), *keys, self.ttl_s, *members))

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self.refresh()
            except Exception:  # never let the heartbeat die: leases would expire under running requests
                log.exception("refreshing tenant leases failed")

    async def usage(self, tenant_id: str) -> Usage:
        """What `tenant_id` holds now: across replicas from Redis, else what this replica counts itself."""
        keys = [_LEASES + tenant_id, _TOKENS + tenant_id]
        reply = None
        if self.redis is not None:
            reply = await self.redis.call(lambda r: r.eval(_USAGE, 2, *keys, self._window_time()))
        if reply is not None:
            return Usage(*(int(v) for v in reply))
        live = self._local.get(tenant_id, {})
        window, spent = self._local_tokens.get(tenant_id, (None, 0))
        return Usage(len(live), sum(live.values()), spent if window == int(self._now() // WINDOW_S) else 0)


@dataclass(frozen=True)
class Usage:
    queued_requests: int
    sequences: int
    tokens_this_minute: int


def _refuse_never_fitting(tenant_name: str, quota: TenantQuota, sequences: int, tokens: int) -> None:
    """A request larger than a limit of its tenant could never be admitted: 400, not a 429 to retry."""
    if quota.max_concurrent_sequences and sequences > quota.max_concurrent_sequences:
        raise Invalid(
            f"this request asks for {sequences} sequences (prompts * n); tenant {tenant_name!r} may run "
            f"{quota.max_concurrent_sequences} at once (max_concurrent_sequences)",
            param="n",
            code="request_too_large",
        )
    if quota.tokens_per_minute and tokens > quota.tokens_per_minute:
        raise Invalid(
            f"this request asks for {tokens} tokens (prompt tokens + max_tokens of every sequence); tenant "
            f"{tenant_name!r} may use {quota.tokens_per_minute} per minute (tokens_per_minute)",
            param="max_tokens",
            code="request_too_large",
        )


_EXCEEDED: dict[str, ErrorCode] = {  # the code of a 429, by the limit it is over
    "max_queued_requests": "max_queued_requests_exceeded",
    "max_concurrent_sequences": "max_concurrent_sequences_exceeded",
    "tokens_per_minute": "tokens_per_minute_exceeded",
}


def _over_limit(
    tenant_name: str, quota: TenantQuota, limit: str, current: int, sequences: int, tokens: int, retry_s: int
) -> RateLimited:
    if limit == "max_queued_requests":
        detail = (
            f"tenant {tenant_name!r} has {current} requests queued or running; its limit is "
            f"{quota.max_queued_requests} (max_queued_requests)"
        )
    elif limit == "max_concurrent_sequences":
        detail = (
            f"tenant {tenant_name!r} has {current} sequences running and this request adds {sequences}; its limit "
            f"is {quota.max_concurrent_sequences} (max_concurrent_sequences)"
        )
    else:
        detail = (
            f"tenant {tenant_name!r} has used or reserved {current} tokens this minute and this request asks for "
            f"{tokens}; its limit is {quota.tokens_per_minute} (tokens_per_minute)"
        )
    retry = max(retry_s, CONCURRENCY_RETRY_S)
    return RateLimited(f"{detail}; retry in {retry}s", code=_EXCEEDED[limit], retry_after_s=retry)
