"""Owns the model weights and the paged KV cache; turns a scheduled batch into logits."""
from __future__ import annotations

from pathlib import Path

import torch

from loraplex.engine.attention_backend import AttentionMetadata
from loraplex.engine.config import EngineArgs, ModelShape
from loraplex.engine.llama import LlamaModel, LoRAContext, load_llama
from loraplex.engine.scheduler import ScheduledBatch
from loraplex.kernels.cpu_attention import cpu_decode_kernel_available
from loraplex.kernels.cpu_prefill_attention import cpu_prefill_kernel_available

_DEFAULT_CPU_KV_BYTES = 2 << 30


class ModelRunner:
    def __init__(self, args: EngineArgs, model_dir: Path, config: dict, max_model_len: int) -> None:
        self.device = args.resolved_device()
        shape = ModelShape.from_config(config)
        self.dtype = args.resolved_dtype(self.device, shape.dtype)
        self.block_size = args.block_size
        self.model: LlamaModel = load_llama(model_dir, config, self.device, self.dtype, max_model_len)
        self.shape = self.model.shape
        self.use_triton = self.device.type == "cuda"
        # attention through the C kernels: float32 CPU caches with head_dim a multiple of 8, and a C compiler
        self.c_attention = (self.device.type == "cpu" and self.dtype == torch.float32 and self.shape.head_dim % 8 == 0
                            and cpu_decode_kernel_available() and cpu_prefill_kernel_available())
        self.num_blocks = self._num_blocks(args, max_model_len)
        s = self.shape
        # [num_blocks, block_size, kv_heads, head_dim] per layer; zeroed so never-written slots are finite.
        self.kv_caches = [
            (torch.zeros(self.num_blocks, self.block_size, s.num_kv_heads, s.head_dim, device=self.device,
                         dtype=self.dtype),
             torch.zeros(self.num_blocks, self.block_size, s.num_kv_heads, s.head_dim, device=self.device,
                         dtype=self.dtype))
            for _ in range(s.num_layers)
        ]

    def _num_blocks(self, args: EngineArgs, max_model_len: int) -> int:
        per_block = self.shape.kv_bytes_per_token(self.dtype) * self.block_size
        if args.num_kv_blocks is not None:
            n = args.num_kv_blocks
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used_elsewhere = total - free
            budget = total * args.gpu_memory_utilization - used_elsewhere - (1 << 30)  # activations headroom
            n = int(budget // per_block)
        else:
            budget = args.kv_cache_bytes or _DEFAULT_CPU_KV_BYTES
            n = int(budget // per_block)
        if n < 1:
            raise ValueError("the KV cache budget is too small for a single block")
        return n

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, lora: LoRAContext | None = None) -> tuple[list[int], torch.Tensor]:
        """Forward the batch; returns (indices into batch.seqs that get a token, their logits [N, V])."""
        ids: list[int] = []
        positions: list[int] = []
        q_lens, ctx_lens, tables = [], [], []
        sample_rows: list[int] = []
        sample_seq_idx: list[int] = []
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start = seq.num_computed_tokens
            ids.extend(seq.tokens(start, start + n))
            positions.extend(range(start, start + n))
            q_lens.append(n)
            ctx_lens.append(start)
            tables.append(seq.block_table)
            if start + n == seq.num_tokens:  # this chunk completes the known tokens: sample the next
                sample_rows.append(len(ids) - 1)
                sample_seq_idx.append(i)
        dev = self.device
        meta = AttentionMetadata.build(q_lens, ctx_lens, tables, self.block_size, dev, self.use_triton,
                                       self.c_attention)
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        hidden = self.model.forward(input_ids, pos, meta, self.kv_caches, lora)
        if not sample_rows:
            return [], hidden.new_empty((0, self.shape.vocab_size), dtype=torch.float32)
        rows = torch.tensor(sample_rows, dtype=torch.long, device=dev)
        return sample_seq_idx, self.model.logits(hidden[rows])
