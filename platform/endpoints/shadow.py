"""Shadow traffic: an endpoint may name a shadow version of its adapter that gets a copy of a share of its calls,
so a new version can be judged on real traffic before any caller sees it. The copy is fire-and-forget: it
starts after the caller's own request has started, runs in the background priority class, is never returned,
and its failures are counted in /metrics (role="shadow"), never raised. Copies in flight are bounded
(`shadow_max_concurrent`); a copy beyond that is dropped and counted (outcome="dropped"), never queued."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from loraplex.platform.endpoints.schemas import Shadow
from loraplex.platform.metrics import EndpointLabels, Metrics

log = logging.getLogger("loraplex.platform")


class ShadowTraffic:
    def __init__(self, metrics: Metrics, max_concurrent: int) -> None:
        self.metrics = metrics
        self.max_concurrent = max_concurrent
        self._running: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    @staticmethod
    def drawn(shadow: Shadow | None) -> bool:
        """Whether this call is copied (an independent draw per call)."""
        return shadow is not None and random.random() < shadow.fraction

    def submit(self, run: Callable[[], Awaitable[None]], labels: EndpointLabels) -> bool:
        """Start `run` (the copy; it counts its own outcomes) unless the copies in flight are at the bound."""
        if len(self._running) >= self.max_concurrent:
            self.metrics.endpoint_requests.labels(*labels, "dropped").inc()
            return False
        task = asyncio.get_running_loop().create_task(self._guard(run, labels))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return True

    async def _guard(self, run: Callable[[], Awaitable[None]], labels: EndpointLabels) -> None:
        try:
            await run()
        except asyncio.CancelledError:  # the server is closing
            raise
        except Exception as exc:  # counted by `run` where it failed; the caller never sees it
            log.info("shadow copy for %s failed: %s", labels, exc)

    async def close(self) -> None:
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
