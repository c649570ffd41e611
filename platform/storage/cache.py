"""Read-through registry cache: an in-process LRU (L1) in front of Redis (L2, optional) in front of SQL.

Correctness across replicas, whatever Redis does (down, hanging, partitioned, a lost message):

* Invalidation bumps a per-key version (locally, and with INCR in Redis), deletes the Redis entry, counts
  itself in a global generation counter and is broadcast over Redis pub/sub, all in one transaction; every
  replica drops its L1 entry when the message arrives.
* Every replica publishes a heartbeat to itself every `heartbeat_s` through the same Redis (a Lua script that
  reads the generation counter and publishes it atomically). Redis delivers one connection's messages in
  order, so our own heartbeat sent at time t coming back proves that every invalidation Redis had by t has
  arrived. L1 and L2 are used only while a heartbeat sent within the last `trust_s` came back; otherwise
  every lookup goes to SQL without touching Redis (so a hung Redis does not stall requests).
* A heartbeat whose generation differs from the count of invalidations received means messages were lost:
  L1 is cleared. A heartbeat that comes back late (trust had lapsed), a lost subscription, or a failed
  Redis call count as an outage: L1 is cleared and, before L1 or L2 is trusted again, the Redis epoch is
  bumped, which voids every Redis entry written before (another replica's invalidation may not have reached
  Redis during the outage). Invalidations that could not reach Redis are retried with every heartbeat.
* A value read from SQL is only stored if no invalidation happened while it was being read (the versions
  seen before the read must still be current), so a slow reader can never put a stale record back.

So a deletion or revocation made on one replica is honoured by every other within `trust_s` (+ one
request) as long as the deleting replica's invalidation reaches Redis, and immediately when Redis is
unreachable for everyone. One limit remains: a replica that cannot reach Redis while others can delivers
its invalidations only when it reaches Redis again (retried every heartbeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from loraplex.platform.background import stop_task
from loraplex.platform.storage.redis_link import RedisLink

log = logging.getLogger("loraplex.platform.cache")

CHANNEL = "loraplex:registry:invalidate"
HEARTBEAT_CHANNEL = "loraplex:registry:heartbeat:"  # + the replica's id: each replica hears only its own
_ENTRY = "loraplex:registry:entry:"
_VERSION = "loraplex:registry:version:"
GENERATION = "loraplex:registry:generation"  # +1 with every invalidation message published on CHANNEL
EPOCH = "loraplex:registry:epoch"  # +1 after an outage: voids every entry written before

HEARTBEAT_S = 0.2
TRUST_S = 0.5
RESUBSCRIBE_S = 3.0  # no heartbeat back for this long: drop the subscription and subscribe again

# Reads the generation and publishes it in one atomic step, so the heartbeat says how many invalidation
# messages were published before it.
_HEARTBEAT_LUA = """
local g = redis.call('GET', KEYS[1]) or '0'
redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' ' .. g)
return g
"""

Loader = Callable[[], Awaitable[Any | None]]


class LocalCache:
    """Bounded LRU with TTL and per-key invalidation versions (one process)."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock  # monotonic seconds; tests drive it to check expiry without waiting
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, tuple[int, int], Any]] = OrderedDict()
        self._versions: dict[str, int] = {}
        self._era = 0  # +1 on clear(): a load started before a clear can never be stored after it

    def version(self, key: str) -> tuple[int, int]:
        return self._era, self._versions.get(key, 0)

    def get(self, key: str) -> Any | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        expires, version, value = hit
        if expires < self.clock() or version != self.version(key):
            self._entries.pop(key, None)
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: Any, version: tuple[int, int]) -> None:
        if version != self.version(key):
            return  # invalidated (or everything cleared) while the value was being loaded
        self._entries[key] = (self.clock() + self.ttl_s, version, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def invalidate(self, key: str) -> None:
        self._versions[key] = self._versions.get(key, 0) + 1
        self._entries.pop(key, None)
        if len(self._versions) > 4 * self.max_entries:
            # Old versions only matter for loads in flight; dropping them can only cause a miss.
            for stale in list(self._versions)[: len(self._versions) // 2]:
                self._versions.pop(stale, None)

    def clear(self) -> None:
        self._era += 1
        self._entries.clear()


def queue_invalidation(pipe: Any, key: str, ttl_s: float) -> None:
    """The Redis side of invalidating `key`, minus the message (queued on a transaction pipeline)."""
    pipe.incr(_VERSION + key)
    pipe.expire(_VERSION + key, max(60, int(ttl_s * 10)))
    pipe.delete(_ENTRY + key)
    pipe.incr(GENERATION)


class RegistryCache:
    """`get_or_load(key, loader)` and `invalidate(key)`; values must be JSON-serialisable."""

    def __init__(
        self,
        ttl_s: float = 60.0,
        redis: RedisLink | None = None,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        trust_s: float = TRUST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Monotonic seconds for the TTL, the heartbeats' send times and the trust window. Tests drive it to bound
        # staleness exactly (what a missed invalidation can cost) without sleeping.
        self.clock = clock
        self.local = LocalCache(ttl_s, clock=clock)
        self.redis = redis
        self.ttl_s = ttl_s
        self.heartbeat_s = heartbeat_s
        self.trust_s = trust_s
        self._tasks: list[asyncio.Task[None]] = []
        self._watchers: list[tuple[str, Callable[[str], None]]] = []
        self._heartbeat_channel = HEARTBEAT_CHANNEL + uuid.uuid4().hex
        self._trusted_until = 0.0  # monotonic: our own heartbeat sent before this - trust_s came back
        self._trusted = asyncio.Event()  # set once the first heartbeat came back
        self._generation: int | None = None  # invalidation messages published before the last one received
        self._outages = 0  # outages seen (late heartbeat, lost subscription, failed call) ...
        self._epoch_bumped = 0  # ... and how many of them the last epoch bump covers
        self._pending: set[str] = set()  # invalidations that did not reach Redis yet
        if redis is not None:
            redis.on_recover(self._after_outage)

    async def start(self) -> None:
        if self.redis is not None and not self._tasks:
            self._tasks = [
                asyncio.create_task(self._listen(), name="registry-invalidation-listener"),
                asyncio.create_task(self._heartbeat(), name="registry-heartbeat"),
            ]
            # Wait briefly for the first heartbeat: until then every lookup goes to SQL.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._trusted.wait(), timeout=2.0)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await stop_task(task)
        self._tasks = []

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

    def trusted(self) -> bool:
        """Whether L1 and L2 may be used now (always, without Redis: this process is the only writer)."""
        if self.redis is None:
            return True
        return (
            self.clock() < self._trusted_until and self._generation is not None and self._epoch_bumped == self._outages
        )

    async def get_or_load(self, key: str, loader: Loader) -> Any | None:
        if not self.trusted():
            return await loader()  # straight to SQL: nothing cached can be vouched for right now
        value = self.local.get(key)
        if value is not None:
            return value
        local_version = self.local.version(key)
        got: list[Any] | None = None
        if self.redis is not None:
            got = await self.redis.call(lambda r: r.mget(_ENTRY + key, _VERSION + key, EPOCH))
            if got is not None:
                raw, version, epoch = got[0], _text(got[1]), _text(got[2])
                if raw is not None:
                    entry = json.loads(raw)
                    if entry.get("v") == version and entry.get("e") == epoch and self.trusted():
                        self.local.put(key, entry["value"], local_version)
                        return entry["value"]
        value = await loader()
        if value is None:
            return None
        if got is not None and self.trusted():
            # Tagged with the version and epoch read before the load: an invalidation meanwhile voids it.
            payload = json.dumps({"v": version, "e": epoch, "value": value})
            # (self.redis is set whenever trusted() is true)
            await self.redis.call(lambda r: r.set(_ENTRY + key, payload, ex=max(1, int(self.ttl_s))))  # type: ignore[union-attr]
        if self.trusted():
            self.local.put(key, value, local_version)
        return value

    async def invalidate(self, key: str) -> None:
        """Drop `key` here, in Redis and (via pub/sub) on every other replica."""
        self.local.invalidate(key)
        self._notify(key)
        if self.redis is None:
            return
        if await self.redis.call(lambda r: self._publish(r, [key], bump_epoch=False)) is None:
            self._pending.add(key)  # delivered by the heartbeat as soon as Redis answers again
            log.warning("invalidation of %r not delivered to Redis yet; retrying with every heartbeat", key)

    async def _publish(self, client: Any, keys: list[str], *, bump_epoch: bool) -> list[Any]:
        async with client.pipeline(transaction=True) as pipe:
            if bump_epoch:
                pipe.incr(EPOCH)
            for key in keys:
                queue_invalidation(pipe, key, self.ttl_s)
                pipe.publish(CHANNEL, key)
            return await pipe.execute()  # type: ignore[no-any-return]  # (redis-py's pipeline is untyped)

    def _outage(self, why: str) -> None:
        """Something may have been missed: forget L1, and trust nothing until the epoch is bumped."""
        self.local.clear()
        self._outages += 1
        log.warning("registry cache: %s; serving from the database until Redis is proven live again", why)

    async def _after_outage(self) -> None:
        self._outage("Redis was unavailable")

    async def _heartbeat(self) -> None:
        """Every `heartbeat_s`: deliver what is pending (epoch bump, invalidations), then a heartbeat."""
        assert self.redis is not None
        client = self.redis.client
        while True:
            started = self.clock()
            try:
                async with asyncio.timeout(4 * self.trust_s):  # the socket timeout should fire first
                    outages, pending = self._outages, list(self._pending)
                    if outages != self._epoch_bumped or pending:
                        await self._publish(client, pending, bump_epoch=outages != self._epoch_bumped)
                        self._epoch_bumped = outages
                        self._pending.difference_update(pending)
                    await client.eval(_HEARTBEAT_LUA, 1, GENERATION, self._heartbeat_channel, repr(started))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the heartbeat is the probe: it does not wait for the link's back-off
                self.redis.mark_down(exc)
            else:
                await self.redis.mark_up()
            await asyncio.sleep(max(0.0, self.heartbeat_s - (self.clock() - started)))

    def _on_message(self, channel: str, data: str, now: float) -> bool:
        """Apply one message; True when it was our own heartbeat."""
        if channel != self._heartbeat_channel:
            self.local.invalidate(data)
            self._notify(data)
            if self._generation is not None:
                self._generation += 1
            return False
        sent, generation = data.split()
        if self._trusted_until and now > self._trusted_until:
            self._outage(f"heartbeat came back {now - self._trusted_until + self.trust_s:.2f}s late")
        if self._generation is not None and generation != str(self._generation):
            self.local.clear()
            log.warning(
                "registry cache: invalidation messages were lost (generation %s, expected %s); cleared",
                generation,
                self._generation,
            )
        self._generation = int(generation)
        self._trusted_until = max(self._trusted_until, float(sent) + self.trust_s)
        self._trusted.set()
        return True

    async def _listen(self) -> None:
        assert self.redis is not None
        delay, first = 0.2, True
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(CHANNEL, self._heartbeat_channel)
                if not first:
                    self._outage("resubscribed to invalidations")
                first, delay = False, 0.2
                heard = self.clock()
                while True:
                    message = await pubsub.get_message(timeout=self.heartbeat_s)
                    now = self.clock()
                    is_message = message is not None and message.get("type") == "message"
                    if is_message and self._on_message(_text(message["channel"]), _text(message["data"]), now):
                        heard = now
                    if now - heard > RESUBSCRIBE_S:
                        raise TimeoutError(f"no heartbeat came back for {RESUBSCRIBE_S}s")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost or silent: SQL only until resubscribed
                self._trusted_until = 0.0
                self._generation = None
                self.redis.mark_down(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


def _text(value: bytes | str | None) -> str:
    if value is None:
        return "0"
    return value.decode() if isinstance(value, bytes) else str(value)
