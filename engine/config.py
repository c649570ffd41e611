"""Engine arguments (names follow vLLM's where the meaning is the same) and the model's shape."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import torch

from loraplex.adapters import BaseModelSpec

DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30
SCHEDULING_POLICIES = ("fcfs", "fair", "priority")


@dataclass
class EngineArgs:
    model: str | os.PathLike | None = None  # None: the bundled SmolLM2-135M-Instruct
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: min(model's max_position_embeddings, 8192)
    # Which waiting request runs next: "fcfs" (arrival order), "fair" (weighted fair share of tokens between
    # tenants, Virtual Token Counter; priority classes first) or "priority" (lowest priority value, then arrival)
    scheduling_policy: str = "fair"
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
    num_kv_blocks: int | None = None  # overrides both when set (tests use tiny caches)
    # Structured output
    grammar_compile_timeout_s: float = 10.0
    grammar_cache_size: int = 256
    grammar_workers: int = 1
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
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.scheduling_policy!r}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def resolved_device(self) -> torch.device:
        if self.device:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def resolved_dtype(self, device: torch.device, checkpoint_dtype: torch.dtype) -> torch.dtype:
        if self.dtype:
            dt = getattr(torch, self.dtype, None)
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"unknown dtype {self.dtype!r}")
            return dt
        if device.type == "cpu":
            return torch.float32  # no native bf16 on these CPUs: float32 is the fast type
        return torch.bfloat16 if checkpoint_dtype == torch.float32 else checkpoint_dtype

    def resolved_lora_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        if not self.lora_dtype or self.lora_dtype == "auto":
            return model_dtype
        dt = getattr(torch, self.lora_dtype, None)
        if dt not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(
                f"lora_dtype must be float32, bfloat16 or float16 (or unset: the model's dtype), "
                f"got {self.lora_dtype!r}"
            )
        return dt


@dataclass(frozen=True)
class ModelShape:
    """What the native model needs from config.json: the dimensions (``spec``, the same description adapters
    are checked against) plus normalisation, rotary and output settings."""

    spec: BaseModelSpec
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        spec = BaseModelSpec.from_hf_config(cfg)
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        for key in ("attention_bias", "mlp_bias"):
            if cfg.get(key):
                raise ValueError(f"config.json sets {key}=true, which loraplex's Llama model does not support")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg.get('hidden_act')!r} (Llama uses 'silu')")
        dtype = getattr(torch, str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"), torch.float32)
        return cls(
            spec=spec,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=None if rope_type == "default" else dict(rope),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            eos_token_ids=eos_ids,
            dtype=dtype if isinstance(dtype, torch.dtype) else torch.float32,
        )

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.spec.hidden_size

    @property
    def intermediate_size(self) -> int:
        return self.spec.intermediate_size

    @property
    def num_layers(self) -> int:
        return self.spec.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.spec.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return self.spec.num_key_value_heads

    @property
    def head_dim(self) -> int:
        return self.spec.head_dim

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.kv_size * torch.empty((), dtype=dtype).element_size()
