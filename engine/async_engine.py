"""The server's engine front: engine steps run in their own thread, each request streams from its own queue.

The asyncio side never touches engine state: it checks a request with ``LLMEngine.precheck`` (validation,
grammar compile and budget), then sends typed messages (``engine.messages``) through a thread-safe queue,
and the engine thread pushes each request's outputs back onto that request's asyncio queue with
``call_soon_threadsafe``. A failing step fails the requests in that step, never the thread; closing a
request's stream early aborts it and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loraplex.adapters import BaseModelSpec
from loraplex.adapters.stacking import BaseWeights
from loraplex.engine.config import EngineArgs
from loraplex.engine.core.share import DEFAULT_SHARE, Share
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.lora.ref import AdapterRef
from loraplex.engine.messages import Abort, AddAdapter, AddRequest, EngineMessage, PinAdapters, RemoveAdapter
from loraplex.engine.outputs import RequestOutput
from loraplex.engine.sample.sampling_params import SamplingParams
from loraplex.engine.stats import EngineStats

if TYPE_CHECKING:
    from loraplex.grammar.backend_types import CompiledGrammar
    from loraplex.grammar.spec import StructuredSpec

log = logging.getLogger(__name__)


@dataclass
class _Stream:
    """One request's mailbox. The engine thread leaves outputs in `pending` (joined into one while the consumer
    has not taken them: a consumer that falls behind gets fewer, larger outputs instead of a growing backlog)
    and wakes the event loop once per step for all the streams that got something. A stream that is not
    ``every_step`` (a non-streaming response) is woken for its first output, its last and an error only: the
    steps between are joined into the last output without costing the event loop anything."""

    loop: asyncio.AbstractEventLoop
    every_step: bool = True
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pending: RequestOutput | None = None
    error: BaseException | None = None
    signalled: bool = False  # a wake-up is on its way or not yet taken (guarded by _mailbox_lock)
    first_sent: bool = False

    def take(self) -> RequestOutput | BaseException | None:
        """(event loop) What arrived since the last take: outputs first, then an error."""
        with _mailbox_lock:
            item: RequestOutput | BaseException | None = self.pending
            if item is None:
                item, self.error = self.error, None
            else:
                self.pending = None
            self.signalled = self.pending is not None or self.error is not None
            return item

    def wants_wake(self, item: RequestOutput | BaseException) -> bool:
        """(engine thread, under _mailbox_lock) Whether leaving ``item`` should wake the consumer."""
        if self.signalled:
            return False  # a wake-up is pending: the consumer takes everything there when it runs
        if self.every_step or isinstance(item, BaseException) or item.finished or not self.first_sent:
            self.first_sent = True
            self.signalled = True
            return True
        return False


_mailbox_lock = threading.Lock()  # guards every _Stream's pending/error (held for a few assignments only)


def _wake(streams: list[_Stream]) -> None:
    for stream in streams:
        stream.ready.set()


class AsyncEngine:
    tokenizer: Any
    model_name: str
    max_model_len: int
    base_spec: BaseModelSpec
    args: EngineArgs

    def __init__(self, args: EngineArgs | None = None, **kwargs: Any) -> None:
        """Builds the engine on its own thread (see `_main`) and returns once it is ready; a failing build
        raises here."""
        self._messages: queue.SimpleQueue[EngineMessage] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._stopped = False
        self._ready = threading.Event()
        self._init_error: BaseException | None = None
        self._stats = EngineStats()  # the engine thread's last snapshot
        self._thread = threading.Thread(
            target=self._main, args=(args or EngineArgs(**kwargs),), name="loraplex-engine", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._init_error is not None:
            self._thread.join()
            raise self._init_error
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        self.max_model_len = self.engine.max_model_len
        self.base_spec = self.engine.base_spec
        # the base model's weights by (layer, group), as DoRA's factors need them (any thread; None: not given)
        self.base_weights: BaseWeights | None = self.engine.lora_manager.base_weights
        self.args = self.engine.args

    # ------------------------------------------------------------------ asyncio side
    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        adapter: AdapterRef | None = None,
        cache_salt: str | None = None,
        share: Share = DEFAULT_SHARE,
        every_step: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs; validation, grammar and budget errors raise before anything is
        generated (the engine thread keeps stepping while a grammar compiles). ``share``: the tenant the
        request is served for, its weight and priority class (see ``engine.core.share``). ``every_step=False`` (a
        caller that only needs the first output and the whole result, e.g. a non-streaming response): the
        outputs between the first and the last come joined into the last one."""
        if self._stopped:
            raise RuntimeError("the engine is shut down")
        prompt_token_ids = list(prompt_token_ids)
        grammar = await asyncio.wrap_future(self.engine.precheck(prompt_token_ids, params))
        request_id = request_id or f"req-{uuid.uuid4().hex[:12]}"
        stream = _Stream(asyncio.get_running_loop(), every_step)
        self._streams[request_id] = stream
        self._send(AddRequest(request_id, prompt_token_ids, params, adapter, cache_salt, grammar, share))
        finished = False
        try:
            while True:
                item = stream.take()
                if item is None:
                    # The engine thread wakes this loop only for a mailbox nobody was signalled for since the last
                    # take, so a wake cannot fall between this take and the wait (callbacks run only while this
                    # task awaits).
                    stream.ready.clear()
                    await stream.ready.wait()
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self._send(Abort(request_id))
            self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._send(Abort(request_id))

    def add_adapter(self, path: str | Path, name: str | None = None) -> AdapterRef:
        """Check a PEFT adapter against the base model (AdapterError if refused); its ref by content hash.

        Reads, hashes and stacks the files in the caller's thread; the engine thread then keeps the host
        copy while a host slot is free, so the adapter's first request only copies it into a device slot.
        """
        adapter = self.engine.read_adapter(path, name)
        self._send(AddAdapter(adapter))
        return adapter.ref

    def compile_grammar(self, spec: StructuredSpec) -> Future[CompiledGrammar]:
        """Compile a constraint ahead of the requests that will use it (they then hit the compile cache; a schema
        with grounded values compiles to its template, bound to each request's text later); fails with GrammarError
        as a request's compile would. Thread-safe."""
        return self.engine.structured.compiler.prepare(spec)

    def remove_adapter(self, adapter: AdapterRef | str) -> None:
        """Drop the adapter's cached copies (on the engine thread); requests naming it later reload it."""
        self._send(RemoveAdapter(adapter.content_hash if isinstance(adapter, AdapterRef) else adapter))

    def pin_adapters(self, content_hashes: Iterable[str]) -> None:
        """Replace the set of adapters the host tier never evicts (see LoRAManager.set_pinned); adapters
        installed after this message (``add_adapter``) take a host slot even when the tier is full."""
        self._send(PinAdapters(tuple(content_hashes)))

    def stats(self) -> EngineStats:
        return self._stats

    def is_alive(self) -> bool:
        """True while the engine thread runs (what /health reports)."""
        return self._thread.is_alive() and not self._stopped

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.engine.close()

    # ------------------------------------------------------------------ engine thread
    def _send(self, message: EngineMessage) -> None:
        self._messages.put(message)
        self._wake.set()

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        self._deliver_all([(request_id, item)])

    def _deliver_all(self, items: list[tuple[str, RequestOutput | BaseException]]) -> None:
        """Leave each item in its request's mailbox; one wake-up per event loop for all the mailboxes that want one
        (``_Stream.wants_wake``: one cross-thread call per step, not one per request)."""
        woken: dict[asyncio.AbstractEventLoop, list[_Stream]] = {}
        with _mailbox_lock:
            for request_id, item in items:
                stream = self._streams.get(request_id)
                if stream is None:
                    continue
                if isinstance(item, BaseException):
                    stream.error = item
                elif stream.pending is None:
                    stream.pending = item
                else:
                    stream.pending = stream.pending.then(item)
                if stream.wants_wake(item):
                    woken.setdefault(stream.loop, []).append(stream)
        for loop, streams in woken.items():
            with contextlib.suppress(RuntimeError):  # the client's event loop is gone
                loop.call_soon_threadsafe(_wake, streams)

    def _handle(self, message: EngineMessage) -> None:
        match message:
            case AddRequest():
                try:
                    self.engine.add_request(
                        message.prompt_token_ids,
                        message.params,
                        message.request_id,
                        adapter=message.adapter,
                        cache_salt=message.cache_salt,
                        grammar=message.grammar,
                        share=message.share,
                    )
                except Exception as exc:  # prechecked already; anything left is reported to that request only
                    self._deliver(message.request_id, exc)
            case Abort():
                out = self.engine.abort(message.request_id)
                if out is not None:
                    self._deliver(message.request_id, out)
            case AddAdapter():
                self.engine.install_adapter(message.adapter)
            case RemoveAdapter():
                self.engine.remove_adapter(message.content_hash)
            case PinAdapters():
                self.engine.lora_manager.set_pinned(message.content_hashes)

    def _drain_messages(self) -> None:
        while True:
            try:
                message = self._messages.get_nowait()
            except queue.Empty:
                return
            self._handle(message)

    def _main(self, args: EngineArgs) -> None:
        """The engine thread. The engine is built here too, so all of its torch work (loading included)
        runs on this thread's OpenMP team: a second team left by a loading thread would slow every later
        step (engine.threads)."""
        try:
            self.engine = LLMEngine(args)
            self._stats = self.engine.stats()
        except BaseException as exc:  # re-raised by __init__ in the caller's thread
            self._init_error = exc
            self._ready.set()
            return
        self._ready.set()
        self._run()

    def _run(self) -> None:
        while not self._stopped:
            self._drain_messages()
            if not self.engine.has_unfinished():
                self._stats = self.engine.stats()
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # one bad step must not take the server down
                log.exception("engine step failed; failing the requests it held")
                outputs = self.engine.fail_running(f"internal engine error: {exc}")
            # the snapshot first: whoever reacts to an output sees counters that include the step that made it
            # (a request finished in its first step was delivered before the snapshot saw its grammar compile)
            self._stats = self.engine.stats()
            self._deliver_all([(out.request_id, out) for out in outputs])
