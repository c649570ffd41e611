"""Running the engine requests behind one HTTP request (n choices, or several prompts) and recording
their latency metrics.

`Generation.start` submits every choice and waits for each one's first output, so validation
errors (prompt too long, bad grammar) surface before any HTTP response has started and become a
proper 4xx. `Generation.outputs()` then yields (choice index, output) as they arrive; `close()`
aborts whatever is still running (client disconnect), which frees the requests' KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from loraplex.engine import AdapterRef, RequestOutput, SamplingParams, Share
from loraplex.engine.core.share import DEFAULT_SHARE
from loraplex.grammar.spec import GrammarError
from loraplex.platform.domain_errors import REFUSALS, Failed, refused
from loraplex.platform.metrics import EndpointLabels, Metrics

if TYPE_CHECKING:
    from loraplex.engine import AsyncEngine

_DONE = object()


@dataclass
class ChoiceInput:
    index: int
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class _Choice:
    index: int
    stream: AsyncIterator[RequestOutput]
    first: RequestOutput
    last_time: float = 0.0
    finished: bool = False
    generated: int = 0  # tokens this choice produced so far


@dataclass
class Generation:
    choices: list[_Choice]
    arrival: float
    metrics: Metrics
    labels: tuple[str, str]  # (tenant, model) for per-adapter request counts
    _closed: bool = field(default=False)
    _merged: AsyncGenerator[tuple[int, RequestOutput], None] | None = field(default=None)
    # Called once by close() with the tokens the request really used (prompts + generated): the tenant's
    # reservation is settled there, whichever way the request ends.
    on_close: Callable[[int], Awaitable[None]] | None = field(default=None)
    used_tokens: int = field(default=0)
    endpoint: EndpointLabels | None = field(default=None)  # endpoint calls: the answering version's labels
    # endpoint calls: `tally(error=, latency_s=, prompt_tokens=, completion_tokens=)` once per finished choice
    # (the per-minute rollups of platform/endpoints/rollups.py)
    tally: Callable[..., None] | None = field(default=None)

    @classmethod
    async def start(
        cls,
        engine: AsyncEngine,
        inputs: list[ChoiceInput],
        adapter: AdapterRef | None,
        *,
        salt: str,
        metrics: Metrics,
        labels: tuple[str, str],
        arrival: float,
        structured_param: str | None = None,
        share: Share = DEFAULT_SHARE,
        on_close: Callable[[int], Awaitable[None]] | None = None,
        endpoint: EndpointLabels | None = None,
        streaming: bool = True,
        tally: Callable[..., None] | None = None,
    ) -> Generation:
        """``streaming=False`` (a response sent whole): each choice's outputs after the first arrive joined into
        its last (the event loop is not woken every step for them)."""
        request_id = f"cmpl-{uuid.uuid4().hex}"
        streams = [
            engine.generate(
                c.prompt_ids,
                c.params,
                request_id=f"{request_id}-{c.index}",
                adapter=adapter,
                cache_salt=salt,
                share=share,
                every_step=streaming,
            )
            for c in inputs
        ]
        firsts = await asyncio.gather(*(s.__anext__() for s in streams), return_exceptions=True)
        errors = [f for f in firsts if isinstance(f, BaseException)]
        failed = [f for f in firsts if isinstance(f, RequestOutput) and f.finish_reason == "error"]
        if errors or failed:
            await _close_all(streams)
            if errors:
                error = errors[0]
                if isinstance(error, REFUSALS):
                    raise refused(error, structured_param if isinstance(error, GrammarError) else None)
                raise error
            raise Failed(failed[0].error or "the engine failed this request", code="engine_error")
        now = time.perf_counter()
        # (firsts holds no exception once the loop above raised the first failure: mypy cannot narrow a zip)
        choices = [_Choice(c.index, s, f, now) for c, s, f in zip(inputs, streams, firsts)]  # type: ignore[misc]
        for ch in choices:
            metrics.ttft.observe(now - arrival)
            metrics.prompt_tokens.inc(len(ch.first.prompt_token_ids))
        gen = cls(
            choices,
            arrival,
            metrics,
            labels,
            on_close=on_close,
            used_tokens=sum(len(c.prompt_ids) for c in inputs),
            endpoint=endpoint,
            tally=tally,
        )
        if endpoint is not None:
            metrics.endpoint_tokens.labels(*endpoint, "prompt").inc(sum(len(c.prompt_ids) for c in inputs))
        for ch in choices:
            gen._record(ch, ch.first, first=True)
        return gen

    def _record(self, choice: _Choice, out: RequestOutput, first: bool = False) -> None:
        now = time.perf_counter()
        if not first and out.new_token_ids:
            self.metrics.itl.observe((now - choice.last_time) / len(out.new_token_ids))
        choice.last_time = now
        self.metrics.generation_tokens.inc(len(out.new_token_ids))
        self.used_tokens += len(out.new_token_ids)
        choice.generated += len(out.new_token_ids)
        if self.endpoint is not None and out.new_token_ids:
            self.metrics.endpoint_tokens.labels(*self.endpoint, "generation").inc(len(out.new_token_ids))
        if out.finished and not choice.finished:
            choice.finished = True
            self.metrics.e2e.observe(now - self.arrival)
            self.metrics.count_request(*self.labels, out.finish_reason or "unknown")
            if self.endpoint is not None:
                self.metrics.endpoint_latency.labels(*self.endpoint).observe(now - self.arrival)
                self.metrics.endpoint_requests.labels(*self.endpoint, out.finish_reason or "unknown").inc()
            self._tally(choice, now, error=out.finish_reason == "error")

    def _tally(self, choice: _Choice, now: float, *, error: bool) -> None:
        if self.tally is not None:
            self.tally(
                error=error,
                latency_s=now - self.arrival,
                prompt_tokens=len(choice.first.prompt_token_ids),
                completion_tokens=choice.generated,
            )

    def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) for every output of every choice, in arrival order (one iteration only)."""
        if self._merged is not None:
            raise RuntimeError("Generation.outputs() can be iterated only once")
        self._merged = self._iterate()
        return self._merged

    async def _iterate(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        if len(self.choices) == 1:
            ch = self.choices[0]
            yield ch.index, ch.first
            if not ch.first.finished:
                async for out in ch.stream:
                    self._record(ch, out)
                    yield ch.index, out
            return
        queue: asyncio.Queue[tuple[_Choice, Any]] = asyncio.Queue()

        async def pump(ch: _Choice) -> None:
            try:
                await queue.put((ch, ch.first))
                if not ch.first.finished:
                    async for out in ch.stream:
                        await queue.put((ch, out))
            except Exception as exc:
                await queue.put((ch, exc))
            finally:
                queue.put_nowait((ch, _DONE))

        tasks = [asyncio.create_task(pump(ch)) for ch in self.choices]
        try:
            remaining = len(tasks)
            while remaining:
                ch, item = await queue.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    if item is not ch.first:
                        self._record(ch, item)
                    yield ch.index, item
        finally:
            for task in tasks:
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def collect(self) -> dict[int, list[RequestOutput]]:
        """Every output of every choice, by choice index (non-streaming responses)."""
        result: dict[int, list[RequestOutput]] = {ch.index: [] for ch in self.choices}
        try:
            async for index, out in self.outputs():
                result[index].append(out)
        finally:
            await self.close()
        return result

    async def close(self) -> None:
        """Abort every unfinished choice (idempotent; safe inside a cancelled task)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if self._merged is not None:
                # Stops the per-choice pump tasks first: a stream cannot be closed while a task iterates it.
                await self._merged.aclose()
            await _close_all([ch.stream for ch in self.choices])
            if self.on_close is not None:
                await self.on_close(self.used_tokens)
        for ch in self.choices:  # what the client left before it finished (a disconnect) counts as aborted
            if not ch.finished:
                ch.finished = True
                self.metrics.count_request(*self.labels, "abort")
                if self.endpoint is not None:
                    self.metrics.endpoint_requests.labels(*self.endpoint, "abort").inc()
                self._tally(ch, time.perf_counter(), error=False)


async def _close_all(streams: list[AsyncIterator[RequestOutput]]) -> None:
    for stream in streams:
        with contextlib.suppress(Exception):
            await stream.aclose()  # type: ignore[attr-defined]  # (an async generator: AsyncIterator lacks aclose)
