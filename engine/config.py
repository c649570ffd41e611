"""Engine arguments (names follow vLLM's where the meaning is the same) and the model's shape."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import torch

from loraplex.adapters import BaseModelSpec
from loraplex.engine.families import ACTIVATIONS, FAMILIES, Family, family_of
from loraplex.engine.speculative import SpeculativeConfig
from loraplex.kernels.cpu_features import require_native_bf16

DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30
DEFAULT_CPU_MULTI_TENANT_STEP_S = 0.12  # see EngineArgs.multi_tenant_step_ms
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
    # Fewer decode steps (engine/speculative.py), both lossless: vLLM's speculative_config for n-gram drafts
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
        if self.multi_tenant_step_ms is not None and not 0.0 <= self.multi_tenant_step_ms < float("inf"):
            raise ValueError(f"multi_tenant_step_ms must be >= 0 (0: no cut), got {self.multi_tenant_step_ms}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.jump_forward_max_running is not None and self.jump_forward_max_running < 1:
            raise ValueError(f"jump_forward_max_running must be >= 1, got {self.jump_forward_max_running}")
        self.resolved_speculative_config()  # refuses a bad one by name

    def resolved_speculative_config(self) -> SpeculativeConfig | None:
        return SpeculativeConfig.parse(self.speculative_config)

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
            if dt == torch.bfloat16 and device.type == "cpu":
                require_native_bf16()  # no emulated bfloat16: refused, naming the missing CPU feature
            return dt
        if device.type == "cpu":
            return torch.float32  # even with native bf16: bf16 changes results (README, "Weights' dtype on the CPU")
        return torch.bfloat16 if checkpoint_dtype == torch.float32 else checkpoint_dtype

    def resolved_multi_tenant_step_s(self, device: torch.device) -> float | None:
        if self.multi_tenant_step_ms is None:
            return DEFAULT_CPU_MULTI_TENANT_STEP_S if device.type == "cpu" else None
        return self.multi_tenant_step_ms / 1e3 or None

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
    are checked against), the family's parts (``engine.families``) and the settings they read."""

    spec: BaseModelSpec
    rms_norm_eps: float
    rope: dict[str, Any]  # rotary parameters of global layers: rope_type, rope_theta and the type's own
    max_position_embeddings: int  # the positions served exactly (longrope: its original length)
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    family: Family = FAMILIES["llama"]
    attention_bias: bool = False  # q/k/v/o biases (Llama, Qwen3, Gemma: `attention_bias`)
    mlp_bias: bool = False  # gate/up/down biases (Llama: `mlp_bias`)
    activation: str = "silu"
    query_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    attn_softcap: float | None = None  # tanh soft-capping of attention scores (Gemma 2)
    final_softcap: float | None = None  # tanh soft-capping of the logits (Gemma 2)
    layer_windows: tuple[int | None, ...] = ()  # per layer: sliding window (keys a query sees), None = global
    local_rope: dict[str, Any] | None = None  # rotary parameters of sliding layers when they differ (Gemma 3)
    rope_max_positions: int = 2048  # config.json's max_position_embeddings, which rope scaling reads

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        family = family_of(cfg)
        spec = BaseModelSpec.from_hf_config(cfg)
        rope, local_rope = rope_parameters(cfg)
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        activation = cfg.get(family.activation_key) or cfg.get("hidden_act") or family.default_activation
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"unsupported {family.activation_key} {activation!r} for {family.model_type} "
                f"(supported: {', '.join(ACTIVATIONS)})"
            )
        for params in (rope, local_rope or rope):
            if params["rope_type"] not in ROPE_TYPES:
                raise ValueError(
                    f"unsupported rope scaling type {params['rope_type']!r} (supported: {', '.join(ROPE_TYPES)})"
                )
        partial = cfg.get("partial_rotary_factor") or rope.get("partial_rotary_factor", 1.0)
        if partial not in (None, 1, 1.0):
            raise ValueError(f"partial_rotary_factor={partial} is not supported (only rotary over the whole head)")
        dtype = getattr(torch, str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"), torch.float32)
        scalar = cfg.get("query_pre_attn_scalar")
        positions = cfg.get("max_position_embeddings", 2048)
        served = positions
        if rope["rope_type"] == "longrope":  # exact up to the original length only (engine.rotary says why)
            served = min(positions, rope["original_max_position_embeddings"])
        return cls(
            spec=spec,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope=rope,
            max_position_embeddings=served,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            eos_token_ids=eos_ids,
            dtype=dtype if isinstance(dtype, torch.dtype) else torch.float32,
            family=family,
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            activation=activation,
            query_scale=float(scalar) ** -0.5 if scalar else None,
            attn_softcap=_positive_or_none(cfg, "attn_logit_softcapping"),
            final_softcap=_positive_or_none(cfg, "final_logit_softcapping"),
            layer_windows=layer_windows(cfg, family, spec.num_hidden_layers),
            local_rope=local_rope,
            rope_max_positions=positions,
        )

    def windows_for(self, max_model_len: int) -> tuple[int | None, ...]:
        """Per layer, the sliding window that matters at this context length (None: the layer sees every
        earlier token, as a window of max_model_len or more does)."""
        windows = self.layer_windows or (None,) * self.num_layers
        return tuple(w if w is not None and w < max_model_len else None for w in windows)

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


def _positive_or_none(cfg: dict[str, Any], key: str) -> float | None:
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{key} must be a positive number or null, got {value!r}")
    return float(value)


def layer_windows(cfg: dict[str, Any], family: Family, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window from config.json (``layer_types`` when present, else the family's layout)."""
    window = cfg.get("sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
        raise ValueError(f"sliding_window must be a positive integer or null, got {window!r}")
    types = cfg.get("layer_types")
    if types is not None:
        if len(types) != num_layers or not set(types) <= {"full_attention", "sliding_attention"}:
            raise ValueError(
                f"layer_types must list 'full_attention' or 'sliding_attention' for each of the {num_layers} layers"
            )
        if "sliding_attention" in types and window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is null")
        return tuple(window if t == "sliding_attention" else None for t in types)
    layout = family.window_layout
    if window is None or layout == "none":
        return (None,) * num_layers
    if layout == "all":
        return (window,) * num_layers
    if layout == "qwen2":
        if not cfg.get("use_sliding_window", False):
            return (None,) * num_layers
        first = cfg.get("max_window_layers", num_layers)
        return tuple(window if i >= first else None for i in range(num_layers))
    if layout == "even":
        return tuple(window if i % 2 == 0 else None for i in range(num_layers))
    pattern = cfg.get("sliding_window_pattern", 6)
    return tuple(window if (i + 1) % pattern else None for i in range(num_layers))


_ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def _one_rope(cfg: dict[str, Any], params: dict[str, Any], theta: float | None) -> dict[str, Any]:
    """One set of rotary parameters as transformers standardises them (rope_type, rope_theta, and the
    pretraining length for the types that read it; Phi-3's top-level original_max_position_embeddings wins)."""
    out = dict(params)
    kind = out.pop("type", None)
    kind = out.get("rope_type", kind) or "default"
    out["rope_type"] = "longrope" if kind == "su" else kind
    if out.get("rope_theta") is None:
        out["rope_theta"] = theta if theta is not None else 10000.0
    out["rope_theta"] = float(out["rope_theta"])
    if out["rope_type"] in _ORIGINAL_LENGTH_TYPES:
        if cfg.get("original_max_position_embeddings") is not None:
            out["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        out.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings", 2048))
    return out


def rope_parameters(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(global layers' rotary parameters, sliding layers' when they differ) from config.json, in either
    transformers' nested per-layer-type form or the older flat ``rope_scaling`` + ``rope_theta`` form (with
    Gemma 3's ``rope_local_base_freq``)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = cfg.get("rope_theta")
    if isinstance(params.get("full_attention"), dict) or isinstance(params.get("sliding_attention"), dict):
        full = _one_rope(cfg, params.get("full_attention") or {}, theta)
        local = params.get("sliding_attention")
        return full, (_one_rope(cfg, local, theta) if isinstance(local, dict) else None)
    full = _one_rope(cfg, params, theta)
    local_theta = cfg.get("rope_local_base_freq")
    local = None if local_theta is None else _one_rope(cfg, {"rope_type": "default"}, float(local_theta))
    return full, local
