"""Engine arguments (names follow vLLM's where the meaning is the same). The model's shape is in
``engine.model.shape``."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import torch

from loraplex.engine.reasoning import REASONING_PARSERS, ReasoningParserName
from loraplex.engine.spec.speculative import SpeculativeConfig
from loraplex.grammar.backend_types import GRAMMAR_BACKENDS, GrammarBackend
from loraplex.kernels.cpu_features import require_native_bf16

DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30
DEFAULT_CPU_MULTI_TENANT_STEP_S = 0.12  # see EngineArgs.multi_tenant_step_ms
# Which waiting request runs next (engine.core.request_queue)
SchedulingPolicy = Literal["fcfs", "fair", "priority"]
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = get_args(SchedulingPolicy)
QUANTIZATIONS = ("gguf", "q8_0", "int8", "none")  # EngineArgs.quantization
QUANTIZED_ACTIVATIONS = ("int8", "none")  # EngineArgs.quantized_activations
INT8_NEEDS_QUANTIZED_WEIGHTS = (
    "quantized_activations 'int8' applies to quantized weights: pass quantization gguf, q8_0 or int8 (or a .gguf "
    "model file, which keeps its blocks on the CPU)"
)


@dataclass
class EngineArgs:
    model: str | os.PathLike[str] | None = None  # None: the bundled SmolLM2-135M-Instruct
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: min(model's max_position_embeddings, 8192)
    # Which waiting request runs next: "fcfs" (arrival order), "fair" (weighted fair share of tokens between
    # tenants, Virtual Token Counter; priority classes first) or "priority" (lowest priority value, then arrival)
    scheduling_policy: SchedulingPolicy = "fair"
    # While two or more tenants have had requests in the engine within the last 30 s (fair policy), a step's
    # token budget is cut so the step is predicted (recent seconds per token) to take about this long: another
    # tenant's first token waits for the step in flight. None: 120 ms on CPU (where a step's time grows with its
    # tokens), no cut on CUDA; 0: no cut. A step that serves a tenant far below its share alone keeps the whole
    # budget.
    multi_tenant_step_ms: float | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    # Multi-LoRA
    max_loras: int = 16
    max_lora_rank: int = 16
    max_cpu_loras: int = 64
    # LoRA weights' storage dtype (device slots and host copies); None: the model's dtype. "float16" or
    # "bfloat16" under a float32 model halves adapter memory and the bytes a step reads, at one rounding of each
    # weight (scaling folded in first; float16 rounds ~8x finer); the arithmetic stays in the model's dtype.
    lora_dtype: str | None = None
    # KV-cache sizing: on CUDA a fraction of device memory, on CPU a byte budget.
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None  # None on CPU: DEFAULT_CPU_KV_CACHE_BYTES (2 GiB)
    # overrides both when set (tests use tiny caches); block ids, each holding one KV-cache group's layers
    num_kv_blocks: int | None = None
    # Structured output
    grammar_compile_timeout_s: float = 10.0
    grammar_cache_size: int = 256
    grammar_workers: int = 1
    # what serves a constraint (vLLM's structured-outputs backend): "auto" (a token automaton where one is small
    # enough, else llguidance, upgraded in the background), or always "outlines" / "llguidance". The choice never
    # changes an output: the backends enforce one language and close it alike (grammar/budget.py)
    grammar_backend: GrammarBackend = "auto"
    # Fewer decode steps (engine/spec/speculative.py), both lossless: vLLM's speculative_config for n-gram drafts
    # ({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": .., "prompt_lookup_max": ..,
    # "disable_by_batch_size": ..}; a JSON string from a flag), and jump-forward over the tokens a grammar forces
    enable_jump_forward: bool = True
    # Jump-forward only while at most this many requests run (None: the speculative config's
    # disable_by_batch_size, else its default, 4): a compute-bound batch computes the forced tokens either way
    # (as a chunk instead of one per step); bench.speculative measured batches of 64 at 0.97x plain with it on
    jump_forward_max_running: int | None = None
    # Opt-in, NOT lossless: byte-level jump-forward. When the grammar forces a text (every allowed continuation
    # starts with it, e.g. `"invoice_number":"` after `{`), its canonical tokenization but the last token (which
    # could merge with what follows) is appended without sampling. Outputs stay valid under the grammar but can
    # differ from plain decoding (the model may have tokenized the text differently).
    jump_forward_bytes: bool = False
    speculative_config: dict[str, Any] | str | None = None
    # vLLM's --reasoning-parser: "qwen3" or "deepseek_r1" (engine/reasoning.py): chat outputs are split into
    # reasoning and content, and a constrained answer comes after the reasoning within the same max_tokens
    reasoning_parser: ReasoningParserName | None = None
    # vLLM's --quantization: how projection weights are stored and multiplied (engine/model/gguf_weights.py,
    # kernels/quant.py). "gguf": a GGUF model's quantized tensors kept in their blocks (Q8_0, Q4_0, Q4_1, Q4_K,
    # Q6_K); "q8_0": any checkpoint's projections quantized to Q8_0 at load; "int8": to int8 per output channel
    # (one float scale a row, kernels/int8_channel.py); "none": float weights in `dtype` (a GGUF model
    # de-quantized at load). None (the default): "gguf" for a model given as a .gguf file on the CPU (it keeps
    # the file's own quantization), else "none" (resolved_quantization).
    quantization: str | None = None
    # "int8": the quantized projections quantize x per group of 32 to int8 and sum exact integer products, as
    # llama.cpp computes on the CPU (faster decode; x's rounding costs accuracy: docs/quantized.md); "none" (and
    # None, the default): x stays float. Needs quantized weights (quantization gguf, q8_0 or int8).
    quantized_activations: str | None = None
    device: str | None = None  # None: cuda if available else cpu
    dtype: str | None = None  # None: the checkpoint's dtype on CUDA (bf16 for fp32), float32 on CPU
    seed: int = 0
    served_model_name: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "max_loras",
            "max_lora_rank",
            "max_cpu_loras",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be > 0, got {self.max_model_len}")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(
                f"grammar_backend must be one of {', '.join(GRAMMAR_BACKENDS)}, got {self.grammar_backend!r}"
            )
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.scheduling_policy!r}"
            )
        if self.multi_tenant_step_ms is not None and not 0.0 <= self.multi_tenant_step_ms < float("inf"):
            raise ValueError(f"multi_tenant_step_ms must be >= 0 (0: no cut), got {self.multi_tenant_step_ms}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.jump_forward_max_running is not None and self.jump_forward_max_running < 1:
            raise ValueError(f"jump_forward_max_running must be >= 1, got {self.jump_forward_max_running}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}"
            )
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.quantized_activations is not None and self.quantized_activations not in QUANTIZED_ACTIVATIONS:
            raise ValueError(
                f"quantized_activations must be one of {', '.join(QUANTIZED_ACTIVATIONS)}, "
                f"got {self.quantized_activations!r}"
            )
        if self.int8_activations and self.quantization == "none":
            raise ValueError(INT8_NEEDS_QUANTIZED_WEIGHTS)
        self.resolved_speculative_config()  # refuses a bad one by name

    @property
    def int8_activations(self) -> bool:
        return self.quantized_activations == "int8"

    def resolved_speculative_config(self) -> SpeculativeConfig | None:
        return SpeculativeConfig.parse(self.speculative_config)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def resolved_device(self) -> torch.device:
        if self.device:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def resolved_quantization(self, device: torch.device) -> str | None:
        """The quantization to load with (None: float weights). Unset, a model given as a path to a .gguf file
        keeps the file's blocks on the CPU ("gguf", the C kernels' home; the bundled default model, named by
        name, stays float32, as do models on CUDA, where quantized weights would be de-quantized at every call).
        quantized_activations "int8" needs quantized weights: refused by name when they resolve to float."""
        quantization = self.quantization
        if quantization is None:
            gguf_file = self.model is not None and str(self.model).endswith(".gguf")
            quantization = "gguf" if gguf_file and device.type == "cpu" else "none"
        if quantization == "none":
            if self.int8_activations:
                raise ValueError(INT8_NEEDS_QUANTIZED_WEIGHTS)
            return None
        return quantization

    def resolved_dtype(self, device: torch.device, checkpoint_dtype: torch.dtype) -> torch.dtype:
        if self.dtype:
            dt = getattr(torch, self.dtype, None)
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"unknown dtype {self.dtype!r}")
            if dt == torch.bfloat16 and device.type == "cpu":
                require_native_bf16()  # no emulated bfloat16: refused, naming the missing CPU feature
            return dt
        if device.type == "cpu":
            return torch.float32  # even with native bf16: bf16 changes results (docs/models.md, bfloat16)
        return torch.bfloat16 if checkpoint_dtype == torch.float32 else checkpoint_dtype

    def resolved_multi_tenant_step_s(self, device: torch.device) -> float | None:
        if self.multi_tenant_step_ms is None:
            return DEFAULT_CPU_MULTI_TENANT_STEP_S if device.type == "cpu" else None
        return self.multi_tenant_step_ms / 1e3 or None

    def resolved_lora_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        if not self.lora_dtype or self.lora_dtype == "auto":
            return model_dtype
        dt = getattr(torch, self.lora_dtype, None)
        if not isinstance(dt, torch.dtype) or dt not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(
                f"lora_dtype must be float32, bfloat16 or float16 (or unset: the model's dtype), "
                f"got {self.lora_dtype!r}"
            )
        return dt
