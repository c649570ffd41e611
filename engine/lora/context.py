"""The per-step LoRA context (llama.LoRAContext): adds each scheduled token's adapter delta in place.

Built once per step from the batch layout: a slot and a token count per scheduled sequence, in batch
order, which is the order of their tokens in the flat batch. The path follows the compute backend:

* ``triton``: every token through the segment (SGMV) kernels of ``kernels.lora``, with one
  ``LoRABatchMapping`` per step; they handle long prefill segments natively.
* ``cpu-c``: every token through the C kernel of ``kernels.cpu_lora``, which reads each active slot's
  weights once at the slot's own rank (a decode step's LoRA cost is reading the adapters' weights) with no
  padding, strided slice GEMMs or scatter copies; prefill tokens go through it in register-blocked tiles.
* ``torch``: runs of at least ``DENSE_MIN_TOKENS`` consecutive tokens under one adapter (prefill chunks)
  as dense in-place GEMMs on their row range at the adapter's own rank, because the grouped path
  materialises every token's full-width delta several times (padding, slice concatenation, row
  selection, scatter-add); the other tokens through the grouped bmm path of ``kernels.lora``.

On every path, when an adapter of the step has DoRA factors for the group (``SlotWeights.dora_scale``), the
output rows are then multiplied by their token's slot's factors (one gather by token and one multiply; base
tokens' and plain adapters' rows by 1); nothing happens for steps without DoRA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from loraplex.engine.lora.slot_weights import LayerGroup, SlotWeights
from loraplex.kernels.backend import ComputeBackend
from loraplex.kernels.cpu_lora import ACTIVATION_DTYPES, CLoRAStep
from loraplex.kernels.lora_mapping import LoRABatchMapping

DENSE_MIN_TOKENS = 16


@contextmanager
def _one_thread(enabled: bool) -> Iterator[None]:
    """Run the enclosed CPU ops on one intra-op thread.

    The torch path's LoRA work is many small ops per layer; on several OpenMP threads each pays a fork/join,
    and index_add_ takes a parallel path that is much slower when another core is busy.
    """
    threads = torch.get_num_threads()
    if not enabled or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class DenseRun:
    start: int
    end: int
    slot: int


class StepLoRAContext:
    """Dense runs and a kernel mapping over the remaining tokens of one step."""

    def __init__(
        self,
        weights: SlotWeights,
        seq_slots: list[int],
        seq_lens: list[int],
        backend: ComputeBackend,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        """``seq_slots[i]``: the slot of the i-th scheduled sequence (-1 = base model); ``seq_lens[i]``: its
        number of tokens in this step. ``backend`` picks the path: ``cpu-c`` sends every token to the C
        kernel, ``torch`` makes dense runs and expands slice by slice, ``triton`` sends every token through the
        Triton kernels. ``compute_dtype`` (default: the slots' dtype) is the activations'; the C kernel reads
        float32, bfloat16 or float16 weights itself, the torch and Triton paths get the layer's weights cast
        to it."""
        self.weights = weights
        self.backend = backend
        self.cpu_paths = backend.name == "torch"  # dense runs and the slice-by-slice expand
        self.compute_dtype = compute_dtype or weights.a["qkv"].dtype
        use_c = backend.name == "cpu-c"
        if use_c and self.compute_dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"the C LoRA kernel takes float32 or bfloat16 activations, not {self.compute_dtype}")
        dense_ok = self.cpu_paths
        self.runs: list[DenseRun] = []
        token_slots: list[int] = []
        pos = i = 0
        while i < len(seq_slots):  # neighbours with the same slot form one run
            j, end = i, pos + seq_lens[i]
            while j + 1 < len(seq_slots) and seq_slots[j + 1] == seq_slots[i]:
                j += 1
                end += seq_lens[j]
            slot = seq_slots[i]
            if slot >= 0 and dense_ok and end - pos >= DENSE_MIN_TOKENS:
                self.runs.append(DenseRun(pos, end, slot))
                token_slots.extend([-1] * (end - pos))
            else:
                token_slots.extend([slot] * (end - pos))
            pos, i = end, j + 1
        # Kernel-path tokens; when they are a strict subset of the step's (prefill runs or base tokens
        # present) the kernels run on those rows only and the result is added back as whole rows. The C
        # kernel addresses rows itself and takes the mapping over all tokens (-1 = not on this path).
        rows = [t for t, s in enumerate(token_slots) if s >= 0]
        self.mapping: LoRABatchMapping | None = None
        self.rows: torch.Tensor | None = None
        self.c_step: CLoRAStep | None = None
        if rows and use_c:
            self.mapping = LoRABatchMapping.build(token_slots, weights.num_slots)
            self.c_step = CLoRAStep(
                {g: (weights.a[g], weights.bt[g], weights.slice_offsets[g]) for g in weights.a},
                self.mapping,
                torch.tensor(weights.ranks, dtype=torch.int32),
                activation_dtype=self.compute_dtype,
            )
        elif rows:
            if len(rows) < len(token_slots):
                self.rows = torch.tensor(rows, dtype=torch.long, device=weights.device)
                token_slots = [token_slots[t] for t in rows]
            self.mapping = LoRABatchMapping.build(
                torch.tensor(token_slots, dtype=torch.long), weights.num_slots, device=weights.device
            )
        active: set[LayerGroup] = set()
        for slot in {s for s in seq_slots if s >= 0}:
            active |= weights.touched[slot]
        self.active = frozenset(active)  # (layer, group) pairs some adapter of this step touches
        dora: set[LayerGroup] = set()
        for slot in {s for s in seq_slots if s >= 0}:
            dora |= weights.dora[slot]
        self.dora = frozenset(dora)  # (layer, group) pairs where some adapter of this step has DoRA factors
        self.dora_rows: torch.Tensor | None = None
        if self.dora:  # every token's row of the DoRA tables: its slot's, or the last (all 1) for base tokens
            per_token = [s if s >= 0 else weights.num_slots for s, n in zip(seq_slots, seq_lens) for _ in range(n)]
            self.dora_rows = torch.tensor(per_token, dtype=torch.long, device=weights.device)

    def apply(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None:
        if (layer, group) not in self.active:
            return
        self._add_deltas(layer, group, x, y)
        if (layer, group) in self.dora:
            self._dora(layer, group, y)

    def _dora(self, layer: int, group: str, y: torch.Tensor) -> None:
        """DoRA: each token's output row (base + delta) times its slot's factors, plus the bias shift if any."""
        rows = self.dora_rows
        assert rows is not None  # (built whenever self.dora is not empty)
        s = self.weights
        y.mul_(s.dora_scale[group][layer].index_select(0, rows).to(y.dtype))  # no copy when the dtypes match
        shift = s.dora_shift.get(group)
        if shift is not None:
            y.add_(shift[layer].index_select(0, rows).to(y.dtype))

    def _add_deltas(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.c_step is not None:  # every token on the C kernel, which runs all of torch's threads
            self.c_step.apply(group, layer, x, y)
            return
        s = self.weights
        a, bt = s.a[group][layer].to(x.dtype), s.bt[group][layer].to(x.dtype)  # no copy when they match
        offsets = s.slice_offsets[group]
        with _one_thread(self.cpu_paths):
            self._dense(layer, group, x, y, a, bt, offsets)
            if self.mapping is None:
                return
            if self.rows is None:
                self._kernels(x, y, a, bt, offsets)
            else:
                delta = y.new_zeros(self.rows.shape[0], y.shape[1])
                self._kernels(x.index_select(0, self.rows), delta, a, bt, offsets)
                y.index_add_(0, self.rows, delta)

    def _dense(
        self,
        layer: int,
        group: str,
        x: torch.Tensor,
        y: torch.Tensor,
        a: torch.Tensor,
        bt: torch.Tensor,
        offsets: tuple[int, ...],
    ) -> None:
        s = self.weights
        for run in self.runs:
            if (layer, group) not in s.touched[run.slot]:
                continue
            r = s.ranks[run.slot]
            # one GEMM for all slices (A at rank r: a small copy when r < max_rank), one per slice back
            shrunk = torch.mm(x[run.start : run.end], a[run.slot, :, :r].reshape(-1, a.shape[-1]).t())
            out = y[run.start : run.end]
            for k, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
                out[:, lo:hi].addmm_(shrunk[:, k * r : (k + 1) * r], bt[run.slot, :r, lo:hi])

    def _kernels(
        self, x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, offsets: tuple[int, ...]
    ) -> None:
        buf = self.backend.lora_shrink(x, a, self.mapping)
        if not self.cpu_paths or len(offsets) == 2:
            self.backend.lora_expand(y, buf, bt.transpose(1, 2), self.mapping, offsets)
        else:
            # One slice at a time into a contiguous buffer: the grouped path would otherwise concatenate the
            # slices' padded outputs, and its row scatter-add into a column slice of y is far slower.
            for k, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
                part = y.new_zeros(y.shape[0], hi - lo)
                self.backend.lora_expand(
                    part, buf[k : k + 1], bt[:, :, lo:hi].transpose(1, 2), self.mapping, (0, hi - lo)
                )
                y[:, lo:hi] += part
