"""Stopping background loops for certain.

A single `task.cancel()` is not always enough: on Python 3.11 a cancellation that arrives as an
`asyncio.timeout` (used inside redis-py) expires comes out as `TimeoutError`, and a loop that treats
Redis errors as "Redis is down, carry on" then never ends, so whatever awaits it hangs forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger("loraplex.platform.background")


async def stop_task(task: asyncio.Task[object], *, poll_s: float = 0.5) -> None:
    """Cancel `task` and wait until it has ended, cancelling again while it keeps running."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=poll_s)
    with contextlib.suppress(asyncio.CancelledError):
        exc = task.exception()
        if exc is not None:
            log.warning("background task %s ended with %s: %s", task.get_name(), type(exc).__name__, exc)


def cancelling() -> bool:
    """True inside a task that has been asked to cancel (an error seen now may be that cancellation in disguise)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
