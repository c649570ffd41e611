"""Owns the model weights, the paged KV cache and the compute backend; turns a scheduled batch into logits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from loraplex.engine.config import DEFAULT_CPU_KV_CACHE_BYTES, EngineArgs
from loraplex.engine.core.block_manager import NULL_BLOCK
from loraplex.engine.core.kv_groups import KVGroups
from loraplex.engine.core.scheduler import ScheduledBatch
from loraplex.engine.model.files import source_gguf
from loraplex.engine.model.llama import DecoderModel, LoRAContext, load_model
from loraplex.engine.model.shape import ModelShape
from loraplex.kernels.attention_plan import AttentionMetadata
from loraplex.kernels.backend import ComputeBackend, select_backend


@dataclass
class RunResult:
    """What one forward pass yields. ``logits`` holds, for each sequence that samples (``sample_idx``: its index
    in ``batch.seqs``), ``sample_counts`` consecutive rows: its last known position, then one per draft.
    ``prompt_logits``: batch index -> (first prompt position predicted, logits rows) of the sequences asking
    for prompt logprobs (row j predicts prompt token first + j)."""

    sample_idx: list[int]
    logits: torch.Tensor
    sample_counts: list[int] = field(default_factory=list)
    prompt_logits: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, args: EngineArgs, model_dir: Path, shape: ModelShape, max_model_len: int) -> None:
        self.device = args.resolved_device()
        self.dtype = args.resolved_dtype(self.device, shape.dtype)
        self.block_size = args.block_size
        self.shape = shape
        # The one choice of kernels (Triton / C / torch): the model, the attention plans and the LoRA contexts
        # of every step all use it.
        self.backend: ComputeBackend = select_backend(
            self.device, self.dtype, shape.head_dim, shape.num_heads, shape.num_kv_heads
        )
        quantization = args.resolved_quantization(self.device)
        gguf = source_gguf(args.model) if quantization == "gguf" else None
        self.model: DecoderModel = load_model(
            model_dir,
            shape,
            self.device,
            self.dtype,
            max_model_len,
            self.backend,
            quantization,
            gguf,
            args.int8_activations,
        )
        # which block table and cache tensor each layer uses (one group unless sliding and global layers mix)
        self.kv_groups = KVGroups.from_windows(shape.windows_for(max_model_len))
        self.num_blocks = self._num_blocks(args)  # what the block manager hands out: 0 .. num_blocks - 1
        # One more block, never handed out and never written: the zeros that block-table entries a sliding window
        # released point at (`_kernel_table`). Reusing a real block there would put another request's K/V (a
        # failed request's NaNs included) under masked positions, where 0 x NaN still poisons a sum.
        self.null_block = self.num_blocks
        # [num_blocks + 1, block_size, kv_heads, head_dim] per layer of a group (engine.core.kv_groups), zeroed so
        # never-written slots are finite; the i-th layer of every group shares the i-th pair.
        cache_shape = (self.num_blocks + 1, self.block_size, shape.num_kv_heads, shape.head_dim)
        self.kv_slots: list[tuple[torch.Tensor, torch.Tensor]] = [
            (
                torch.zeros(cache_shape, device=self.device, dtype=self.dtype),
                torch.zeros(cache_shape, device=self.device, dtype=self.dtype),
            )
            for _ in range(self.kv_groups.layers_per_group)
        ]
        self.kv_caches = [self.kv_slots[slot] for slot in self.kv_groups.layer_slot]  # per layer

    def zero_blocks(self, blocks: list[int]) -> None:
        """Overwrite these blocks' K/V with zeros in every layer. Attention masks stale slots (a partly filled
        last block, positions outside a window) but on the torch and Triton paths still multiplies them by a
        zero weight, and 0 x NaN is NaN: a failed request's non-finite K/V must not reach the next owner."""
        if not blocks:
            return
        idx = torch.tensor(blocks, dtype=torch.long, device=self.device)
        for k, v in self.kv_slots:
            k.index_fill_(0, idx, 0.0)
            v.index_fill_(0, idx, 0.0)

    def _num_blocks(self, args: EngineArgs) -> int:
        # a block id holds K/V for one group's layers: layers_per_group of num_layers
        per_block = (
            self.shape.kv_bytes_per_token(self.dtype)
            * self.block_size
            * self.kv_groups.layers_per_group
            // self.shape.num_layers
        )
        if args.num_kv_blocks is not None:
            n = args.num_kv_blocks
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used_elsewhere = total - free
            budget = total * args.gpu_memory_utilization - used_elsewhere - (1 << 30)  # activations headroom
            n = int(budget // per_block)
        else:
            budget = args.kv_cache_bytes or DEFAULT_CPU_KV_CACHE_BYTES
            n = int(budget // per_block)
        if n < self.kv_groups.num_groups:
            raise ValueError(
                f"the KV cache budget is too small: {n} blocks, but a sequence needs one in each of the model's "
                f"{self.kv_groups.num_groups} KV-cache groups"
            )
        return n

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, lora: LoRAContext | None = None) -> RunResult:
        """Forward the batch: the logits of the sequences that get a token, and prompt logprob rows."""
        ids: list[int] = []
        positions: list[int] = []
        q_lens: list[int] = []
        ctx_lens: list[int] = []
        groups = self.kv_groups.num_groups
        tables: list[list[list[int]]] = [[] for _ in range(groups)]  # per group, per sequence
        sample_rows: list[int] = []
        sample_seq_idx: list[int] = []
        sample_counts: list[int] = []
        prompt_rows: dict[int, tuple[int, int, int]] = {}  # batch index -> (first target, first row, rows)
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start = seq.num_computed_tokens
            last = min(start + n, seq.num_prompt_tokens - 1)  # positions start..last-1 predict a prompt token
            if seq.params.prompt_logprobs is not None and last > start:
                prompt_rows[i] = (start + 1, len(ids), last - start)
            ids.extend(seq.step_tokens(start, start + n))
            positions.extend(range(start, start + n))
            q_lens.append(n)
            ctx_lens.append(start)
            for g in range(groups):
                tables[g].append(_kernel_table(seq.block_tables[g], self.null_block))
            drafts = len(seq.spec_token_ids)
            if start + n == seq.num_tokens + drafts:  # this chunk completes the known tokens: sample the next
                sample_rows.extend(range(len(ids) - 1 - drafts, len(ids)))
                sample_seq_idx.append(i)
                sample_counts.append(1 + drafts)
        dev = self.device
        metas = [AttentionMetadata.build(q_lens, ctx_lens, t, self.block_size, dev, self.backend.name) for t in tables]
        meta = metas[0] if groups == 1 else [metas[g] for g in self.kv_groups.layer_group]
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        hidden = self.model.forward(input_ids, pos, meta, self.kv_caches, lora)
        prompt_logits = {
            i: (target, self.model.logits(hidden[row : row + count])) for i, (target, row, count) in prompt_rows.items()
        }
        if not sample_rows:
            empty = hidden.new_empty((0, self.shape.vocab_size), dtype=torch.float32)
            return RunResult([], empty, [], prompt_logits)
        if len(sample_rows) == len(ids):  # every row samples (rows only increase): no gather (decode steps)
            return RunResult(sample_seq_idx, self.model.logits(hidden), sample_counts, prompt_logits)
        rows = torch.tensor(sample_rows, dtype=torch.long, device=dev)
        return RunResult(sample_seq_idx, self.model.logits(hidden[rows]), sample_counts, prompt_logits)


def _kernel_table(table: list[int], null_block: int) -> list[int]:
    """The block table the attention kernels get: entries a sliding window released (NULL_BLOCK, always a
    leading run) point at the runner's zero block, whose contents no query weighs: the C kernels start reading
    at the window, the Triton kernel's first tile and the torch paths mask those positions. New tokens never
    land there (slots are computed for positions past the window only)."""
    if not table or table[0] != NULL_BLOCK:
        return table
    return [null_block if b == NULL_BLOCK else b for b in table]
