"""The model's shape: what the native model needs from config.json (dimensions, family, rotary and window
settings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from loraplex.adapters import BaseModelSpec
from loraplex.engine.model.families import ACTIVATIONS, FAMILIES, Family, family_of


@dataclass(frozen=True)
class ModelShape:
    """What the native model needs from config.json: the dimensions (``spec``, the same description adapters
    are checked against), the family's parts (``engine.model.families``) and the settings they read."""

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
        if rope["rope_type"] == "longrope":  # exact up to the original length only (engine.model.rotary says why)
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
