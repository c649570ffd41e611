"""Background loops stop for certain, even when a cancellation comes back disguised as a Redis timeout.

On Python 3.11 a cancellation that lands while redis-py's `asyncio.timeout` expires surfaces as a
`TimeoutError`; a heartbeat that treats Redis errors as an outage then loops forever and `close()` hangs
(seen once in CI as a 900 s test timeout). These tests inject exactly that disguise."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import TimeoutError as RedisTimeout

from loraplex.platform.background import stop_task
from loraplex.platform.storage.redis_link import RedisLink
from loraplex.platform.tenants.limits import TenantLimits
from tests.platform.helpers import REDIS_URL


async def test_stop_task_cancels_again_a_loop_that_swallowed_the_first_cancel() -> None:
    swallowed = 0
    looping = asyncio.Event()

    async def stubborn() -> None:
        nonlocal swallowed
        looping.set()
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 1:
                    continue  # the disguised cancellation: the loop carries on
                raise

    task = asyncio.create_task(stubborn())
    await asyncio.wait_for(looping.wait(), timeout=5)  # cancelled inside its loop, not before it starts
    await asyncio.wait_for(stop_task(task, poll_s=0.1), timeout=5)
    assert task.cancelled() and swallowed == 2


async def test_stop_task_reports_a_task_that_already_failed(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise ValueError("boom")

    task = asyncio.create_task(broken(), name="broken-loop")
    await asyncio.wait([task])  # it has failed
    await stop_task(task)
    assert "broken-loop ended with ValueError: boom" in caplog.text


async def test_redis_call_turns_a_disguised_cancellation_back_into_cancelled() -> None:
    link = RedisLink(REDIS_URL)
    started = asyncio.Event()

    async def slow_command(_client: object) -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError as exc:
            raise RedisTimeout("Timeout reading from socket") from exc

    try:
        task = asyncio.create_task(link.call(slow_command))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert link.healthy, "a cancellation is not a Redis outage"
    finally:
        await link.close()


async def test_redis_call_still_reports_a_real_timeout_as_down() -> None:
    link = RedisLink(REDIS_URL)

    async def times_out(_client: object) -> None:
        raise RedisTimeout("Timeout reading from socket")

    try:
        assert await link.call(times_out) is None
        assert not link.healthy
    finally:
        await link.close()


async def test_tenant_limits_close_ends_a_heartbeat_cancelled_mid_refresh() -> None:
    """The heartbeat is cancelled while its refresh is in Redis and the cancellation comes back as a timeout."""
    link = RedisLink(REDIS_URL)
    limits = TenantLimits(link, ttl_s=0.3)
    in_refresh = asyncio.Event()

    async def refresh_that_hangs() -> None:
        in_refresh.set()
        await link.call(slow_command)

    async def slow_command(_client: object) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError as exc:
            raise RedisTimeout("Timeout reading from socket") from exc

    limits.refresh = refresh_that_hangs  # type: ignore[method-assign]  # (the fault, on this instance only)
    try:
        await limits.start()
        await asyncio.wait_for(in_refresh.wait(), timeout=5)
        await asyncio.wait_for(limits.close(), timeout=5)
        assert limits._heartbeat is None
    finally:
        await link.close()
