"""Graceful drain: on SIGTERM a replica stops admitting (503 with Retry-After, /ready false), lets the
requests it has (streams included) finish within `drain_timeout_s`, then exits.

`Drain` is an ASGI middleware around the whole app: it counts every HTTP request from its start to the
last byte of its response, and refuses new ones while draining except the probes (/health, /ready,
/metrics), so a load balancer sees the replica leave and its clients retry elsewhere."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from litestar.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("loraplex.platform")

PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})


class Drain:
    """Draining state and the count of requests in flight (one event loop: no lock needed)."""

    def __init__(self, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.draining_since: float | None = None

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    def begin(self) -> None:
        """Stop admitting (safe to call from a signal handler: it only sets a field)."""
        if self.draining_since is None:
            self.draining_since = time.monotonic()

    def done(self, timeout_s: float) -> bool:
        """True once draining and every request has finished, or the timeout has passed."""
        if self.draining_since is None:
            return False
        if self.in_flight == 0:
            return True
        if time.monotonic() - self.draining_since >= timeout_s:
            log.warning("drain timeout (%.0fs) with %d requests still in flight; exiting", timeout_s, self.in_flight)
            return True
        return False

    def middleware(self, app: ASGIApp) -> ASGIApp:
        async def drain_aware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            if self.draining and scope["path"] not in PROBE_PATHS:
                await self._refuse(send)
                return
            self.in_flight += 1
            try:
                await app(scope, receive, send)
            finally:
                self.in_flight -= 1

        return drain_aware

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": "this replica is shutting down and admits no new requests; retry (another replica)",
                    "type": "service_unavailable",
                    "param": None,
                    "code": "draining",
                }
            }
        ).encode()
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after_s).encode()),
            (b"connection", b"close"),
        ]
        start: Any = {"type": "http.response.start", "status": 503, "headers": headers}
        await send(start)
        await send({"type": "http.response.body", "body": body})
