"""The LoRA manager: device slots, a host-memory LRU of loaded adapters, and loading from disk off the engine thread.

Life of an adapter, by content hash:

1. ``read`` (any thread) reads, checks and stacks it, and ``install`` keeps it in the host LRU at once when a
   host slot is free, as vLLM's ``add_lora`` does (``add`` is both); the read it needs for the content hash
   is the load's read, so this costs little more than checking it. Otherwise, a request names it
   (``register``: hash -> path), and while requests for it wait, ``plan_loads`` (once per step, in waiting
   order) gives it room in the host LRU and a loader thread reads, checks and stacks it.
   Host entries that waiting requests still need are never evicted, so loads cannot thrash. Pinned adapters
   (``set_pinned``: a pinned endpoint serves them) are never evicted either, and ``install`` makes room for one
   by evicting the least recently used unpinned entry; at most ``max_cpu_loras - 1`` are pinned, so a load
   always finds a host slot.
2. Once loaded (``is_ready``) the scheduler may admit its requests; ``prepare`` (after scheduling) copies
   it into a device slot, evicting the least recently used slot that no running sequence uses.
3. A failed load is kept until the engine takes it (``take_failures``) and fails the requests waiting
   for that adapter; every other request goes on.

All methods except ``read`` and the loader callbacks run on the engine thread; the host LRU and the loading /
failure tables are shared with the loader threads under one lock.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loraplex.adapters import (
    LORA_GROUPS,
    AdapterError,
    AdapterLimits,
    BaseModelSpec,
    LoadedAdapter,
    load_adapter,
    stack_adapter,
)
from loraplex.adapters.stacking import BaseWeights, bounded_dora_scale, dora_groups
from loraplex.engine.core.sequence import Sequence
from loraplex.engine.lora.context import StepLoRAContext
from loraplex.engine.lora.ref import AdapterRef
from loraplex.engine.lora.slot_table import SlotTable
from loraplex.engine.lora.slot_weights import HostAdapter, LayerGroup
from loraplex.engine.stats import LoRAStats
from loraplex.engine.threads import single_threaded_torch
from loraplex.kernels.backend import ComputeBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckedAdapter:
    """An adapter read and checked against the base model: its ref and its stacked weights in host memory."""

    ref: AdapterRef
    host: HostAdapter


class LoRAManager:
    def __init__(
        self,
        base: BaseModelSpec,
        *,
        max_loras: int,
        max_cpu_loras: int,
        max_lora_rank: int,
        device: torch.device,
        dtype: torch.dtype,
        backend: ComputeBackend,
        compute_dtype: torch.dtype | None = None,
        loader_workers: int = 2,
        limits: AdapterLimits = AdapterLimits(),
        base_weights: BaseWeights | None = None,
    ) -> None:
        """``dtype``: the weights' storage dtype; ``compute_dtype`` (default: ``dtype``): the model's, which
        the LoRA arithmetic runs in; ``backend``: the engine's kernels, which the step contexts use;
        ``base_weights``: the base model's weights, which DoRA adapters need (without it they are refused)."""
        if max_cpu_loras < max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras})")
        self.base = base
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.max_lora_rank = max_lora_rank
        self.device = device
        self.dtype = dtype
        self.compute_dtype = compute_dtype or dtype
        self.backend = backend
        self.limits = limits
        self.base_weights = base_weights
        self.slot_table = SlotTable(base, max_loras, max_lora_rank, device, dtype)
        self._step = 0
        self._paths: dict[str, str] = {}
        # shared with loader threads
        self._lock = threading.Lock()
        self._loaded = threading.Condition(self._lock)
        self._host: OrderedDict[str, HostAdapter] = OrderedDict()  # LRU order, oldest first
        self._loading: set[str] = set()
        self._failed: dict[str, str] = {}
        self._pinned: frozenset[str] = frozenset()  # never evicted from the host LRU
        self._retiring: set[str] = set()  # removed while requests still name them: dropped once none does
        self._pool = ThreadPoolExecutor(
            max_workers=loader_workers, thread_name_prefix="loraplex-lora-loader", initializer=single_threaded_torch
        )
        # statistics (device slot loads and evictions: self.slot_table)
        self.num_disk_loads = 0
        self.num_host_evictions = 0
        self.num_load_failures = 0

    # ------------------------------------------------------------------ adapter identity
    def read(self, path: str | Path, name: str | None = None) -> CheckedAdapter:
        """Read, check and stack an adapter (raises AdapterError). Touches no manager state: any thread may call
        it, and the engine thread then ``install``s the result."""
        host = self._read_host_adapter(str(path))
        return CheckedAdapter(
            AdapterRef(content_hash=host.content_hash, path=str(path), name=name or Path(path).name), host
        )

    def install(self, adapter: CheckedAdapter) -> None:
        """Remember where the adapter loads from, and keep its host copy while a host slot is free.

        Never evicts: a full host LRU keeps serving the adapters in use, and this one loads on demand.
        """
        self.register(adapter.ref)
        content_hash = adapter.ref.content_hash
        with self._lock:
            if content_hash in self._host:
                self._host.move_to_end(content_hash)
                return
            if content_hash in self._pinned and not self._host_has_room():
                victim = next((v for v in self._host if v not in self._pinned), None)
                if victim is not None:
                    del self._host[victim]
                    self.num_host_evictions += 1
            if content_hash not in self._loading and self._host_has_room():
                self._store(adapter.host)
                self._failed.pop(content_hash, None)

    def set_pinned(self, content_hashes: Iterable[str]) -> list[str]:
        """Keep these adapters in the host tier from now on (replacing the previous set); adapters no longer in
        the set become ordinary LRU entries. Returns the hashes pinned: at most ``max_cpu_loras - 1`` (the
        first ones given), so a load always finds a host slot; the rest are refused (logged), never widened.

        A pinned adapter that is not loaded yet is loaded by ``install`` (the caller reads it)."""
        wanted = list(dict.fromkeys(content_hashes))
        limit = self.max_cpu_loras - 1
        if len(wanted) > limit:
            log.warning("%d adapters asked to be pinned, max_cpu_loras - 1 = %d: pinning the first", len(wanted), limit)
        with self._lock:
            self._pinned = frozenset(wanted[:limit])
        return wanted[:limit]

    def add(self, path: str | Path, name: str | None = None) -> AdapterRef:
        """``read`` then ``install``, on the calling thread."""
        adapter = self.read(path, name)
        self.install(adapter)
        return adapter.ref

    def register(self, ref: AdapterRef) -> None:
        """Remember where to load ``ref`` from (the latest path wins)."""
        self._paths[ref.content_hash] = ref.path

    def remove(self, content_hash: str, running: Iterable[Sequence] = (), waiting: Iterable[Sequence] = ()) -> bool:
        """Drop an adapter's cached copies (host and device), now or, while requests still name it, once the
        last of them ends (its version was deleted: its files may be gone, so the copies are what they run on).

        Requests added later that name it load it again from their ref's path. Returns whether a copy was or
        will be dropped."""
        referenced = {s.adapter_hash for s in running} | {s.adapter_hash for s in waiting}
        if content_hash in referenced:
            with self._lock:
                held = content_hash in self._host or content_hash in self._loading or content_hash in self.slot_table
                if held:
                    self._retiring.add(content_hash)
            if held:
                self.slot_table.demote(content_hash)  # evicted first once its sequences finish
                return True
        return self._drop(content_hash, {s.adapter_hash for s in running})

    def _drop(self, content_hash: str, in_use: set[str | None]) -> bool:
        with self._lock:
            self._retiring.discard(content_hash)
            dropped = self._host.pop(content_hash, None) is not None
        if content_hash in self.slot_table and content_hash not in in_use:
            dropped = self.slot_table.release(content_hash) or dropped
        else:
            self.slot_table.demote(content_hash)
        return dropped

    def is_retiring(self, content_hash: str) -> bool:
        return content_hash in self._retiring

    def drop_retired(self, referenced: set[str | None]) -> None:
        """Drop the retiring adapters no request names any more (``referenced``: the adapters requests name).
        Called once per step (plan_loads) and when a retiring adapter's request ends (the engine may go idle)."""
        with self._lock:
            done = [h for h in self._retiring if h not in referenced and h not in self._loading]
        for h in done:
            self._drop(h, set())

    # ------------------------------------------------------------------ loading (host LRU)
    def is_ready(self, content_hash: str) -> bool:
        """Whether requests for this adapter can run now (in a device slot or loaded in host memory)."""
        if content_hash in self.slot_table:
            return True
        with self._lock:
            return content_hash in self._host

    def plan_loads(self, wanted: list[str], keep: set[str]) -> None:
        """Start loads for adapters that waiting requests need, in the order given, while host room allows.

        ``wanted``: distinct adapters of the waiting requests, oldest request first. Host entries among
        them are pinned; room for a new load comes from free host slots or from evicting the least
        recently used unpinned entry. ``keep``: adapters of running sequences (their paths are kept).
        """
        self.drop_retired({*wanted, *keep})
        start: list[str] = []
        with self._lock:
            pinned: set[str] = set()
            for h in wanted:
                if h in self.slot_table or h in self._failed:
                    continue
                if h in self._host or h in self._loading:
                    pinned.add(h)
                    continue
                if h not in self._paths:
                    continue  # never registered: cannot happen through the engine
                if not self._host_has_room():
                    victim = next((v for v in self._host if v not in pinned and v not in self._pinned), None)
                    if victim is None:
                        break  # host memory is full of adapters that waiting requests need
                    del self._host[victim]
                    self.num_host_evictions += 1
                self._loading.add(h)  # reserves the host room
                start.append(h)
                pinned.add(h)
            live = (
                set(wanted)
                | keep
                | set(self.slot_table.resident())
                | set(self._host)
                | self._loading
                | set(self._failed)
            )
        # Submitted outside the lock: a callback of an already finished future runs in this thread.
        for h in start:
            fut = self._pool.submit(self._load, h, self._paths[h])
            fut.add_done_callback(functools.partial(self._on_loaded, h))
        for h in [h for h in self._paths if h not in live]:
            del self._paths[h]

    def _load(self, content_hash: str, path: str) -> HostAdapter:
        """Loader thread: read, check and stack one adapter, which must still have ``content_hash``."""
        host = self._read_host_adapter(path)
        if host.content_hash != content_hash:
            raise AdapterError(
                f"the adapter at {path!r} has content hash {host.content_hash}, but the request "
                f"names {content_hash} (the file changed after it was registered)",
                code="hash_mismatch",
            )
        return host

    def _read_host_adapter(self, path: str) -> HostAdapter:
        """Read, check and stack one adapter into the engine's layout in host memory."""
        adapter = load_adapter(path, self.base, max_lora_rank=self.max_lora_rank, limits=self.limits)
        touched = set(adapter.weights)  # (layer, module) pairs with LoRA weights
        stacked = stack_adapter(adapter, self.base, self.max_lora_rank, self.dtype, "cpu")
        weights = {}
        for (layer, group), (a, b) in stacked.items():
            if any((layer, m) in touched for m in LORA_GROUPS[group]):
                b = b.t().contiguous()  # the slots hold B transposed (see slot_weights)
                if self.device.type == "cuda":
                    a, b = a.pin_memory(), b.pin_memory()
                weights[(layer, group)] = (a, b)
        dora = self._dora_factors(adapter) if adapter.use_dora else {}
        if self.device.type == "cuda":
            dora = {key: (f.pin_memory(), None if s is None else s.pin_memory()) for key, (f, s) in dora.items()}
        nbytes = sum(a.nbytes + b.nbytes for a, b in weights.values())
        nbytes += sum(f.nbytes + (0 if s is None else s.nbytes) for f, s in dora.values())
        return HostAdapter(adapter.content_hash, adapter.rank, weights, nbytes, dora)

    def _dora_factors(self, adapter: LoadedAdapter) -> dict[LayerGroup, tuple[torch.Tensor, torch.Tensor | None]]:
        """DoRA's row factors (and bias shifts) of every (layer, group) with a magnitude vector, from the base
        weights one group at a time (each float copy is freed before the next), in the model's dtype on the host."""
        if self.base_weights is None:
            raise AdapterError(
                "DoRA adapters need the base model's weights, which this engine does not give", code="dora"
            )
        out: dict[LayerGroup, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for layer, group in dora_groups(adapter):
            weight, bias = self.base_weights(layer, group)
            scale = bounded_dora_scale(adapter, self.base, layer, group, weight)  # (uploads are checked alike)
            del weight
            assert scale is not None  # (some module of the group has a magnitude)
            shift = None if bias is None else ((1 - scale) * bias.to(scale.dtype)).to("cpu", self.compute_dtype)
            out[(layer, group)] = (scale.to("cpu", self.compute_dtype), shift)
        return out

    def _host_has_room(self) -> bool:
        """A host slot is free (loads in flight hold theirs). Call under the lock."""
        return len(self._host) + len(self._loading) < self.max_cpu_loras

    def _store(self, host: HostAdapter) -> None:
        """Keep a freshly read adapter in the host LRU (most recent) and count the disk load. Under the lock."""
        self._host[host.content_hash] = host
        self.num_disk_loads += 1

    def _on_loaded(self, content_hash: str, fut: Future[Any]) -> None:
        with self._loaded:
            self._loading.discard(content_hash)
            self._loaded.notify_all()
            if fut.cancelled():  # the manager is closing
                return
            exc = fut.exception()
            if exc is None:
                self._store(fut.result())
                return
            if not isinstance(exc, (AdapterError, OSError)):
                log.error("loading LoRA adapter %s failed", content_hash, exc_info=exc)
            self._failed[content_hash] = str(exc) or type(exc).__name__
            self.num_load_failures += 1

    def take_failures(self) -> dict[str, str]:
        """Adapters whose load failed since the last call: content hash -> error message."""
        with self._lock:
            failed, self._failed = self._failed, {}
        return failed

    def wait_for_loads(self, timeout: float) -> None:
        """Block until some load finishes (or ``timeout``); returns at once when nothing is loading."""
        with self._loaded:
            if self._loading:
                self._loaded.wait(timeout)

    # ------------------------------------------------------------------ device slots
    def _host_copy(self, content_hash: str) -> HostAdapter | None:
        with self._lock:
            host = self._host.get(content_hash)
            if host is not None:
                self._host.move_to_end(content_hash)
        return host

    def prepare(
        self, seqs: list[Sequence], num_new_tokens: list[int], running: Iterable[Sequence]
    ) -> StepLoRAContext | None:
        """Make the step's adapters resident and build its LoRA context; None when no sequence uses one.

        Slots of adapters used by ``running`` sequences (which include every scheduled one) are pinned.
        """
        self._step += 1
        if not any(s.adapter_hash for s in seqs):
            return None
        in_use = {s.adapter_hash for s in running if s.adapter_hash}
        slot_of: dict[str, int] = {}
        slots: list[int] = []
        for seq in seqs:
            h = seq.adapter_hash
            if h is not None and h not in slot_of:
                host = None if h in self.slot_table else self._host_copy(h)
                slot_of[h] = self.slot_table.activate(h, host, in_use | {h}, self._step)
            slots.append(slot_of[h] if h is not None else -1)
        return StepLoRAContext(
            self.slot_table.weights, slots, list(num_new_tokens), self.backend, compute_dtype=self.compute_dtype
        )

    # ------------------------------------------------------------------ introspection
    def resident(self) -> list[str]:
        return self.slot_table.resident()

    def stats(self, running: Iterable[Sequence] = (), waiting: Iterable[Sequence] = ()) -> LoRAStats:
        """Counters and adapter lists (content hashes) for metrics and vLLM's lora_requests_info."""
        with self._lock:
            host, pinned = list(self._host), self._pinned
        return LoRAStats(
            max_loras=self.max_loras,
            running_adapters=sorted({s.adapter_hash for s in running if s.adapter_hash}),
            waiting_adapters=list(dict.fromkeys(s.adapter_hash for s in waiting if s.adapter_hash)),
            max_cpu_loras=self.max_cpu_loras,
            loads=self.slot_table.num_loads,
            evictions=self.slot_table.num_evictions,
            disk_loads=self.num_disk_loads,
            cpu_evictions=self.num_host_evictions,
            load_failures=self.num_load_failures,
            resident_adapters=self.resident(),
            cpu_adapters=len(host),
            host_adapters=host,
            pinned_adapters=sorted(pinned),
        )

    def check_invariants(self, running: Iterable[Sequence]) -> None:
        """At most max_loras distinct adapters run, each in a device slot; the slot tables agree."""
        adapters = {s.adapter_hash for s in running if s.adapter_hash}
        if len(adapters) > self.max_loras:
            raise AssertionError(f"{len(adapters)} distinct adapters run, max_loras is {self.max_loras}")
        self.slot_table.check_invariants(adapters)
        with self._lock:
            if len(self._host) + len(self._loading) > self.max_cpu_loras:
                raise AssertionError(
                    f"{len(self._host)} loaded + {len(self._loading)} loading adapters exceed "
                    f"max_cpu_loras {self.max_cpu_loras}"
                )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
