"""Shape description of the base model that adapters are checked against and stacked for."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The seven LoRA-able projections of a Llama-family decoder layer, in the engine's order, with the
# submodule that holds them ("model.layers.{i}.{block}.{module}").
MODULE_BLOCKS: dict[str, str] = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
LORA_MODULES: tuple[str, ...] = tuple(MODULE_BLOCKS)

# Class names for configs that do not list `architectures` (e.g. a LlamaConfig built in code).
_DEFAULT_ARCHITECTURES = {"llama": "LlamaForCausalLM"}


def _field(config: Any, name: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


def _positive_int(config: Any, name: str) -> int:
    value = _field(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"base model config: {name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class BaseModelSpec:
    """The base model's architecture and the dimensions LoRA weights must fit."""

    architecture: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int

    @classmethod
    def from_hf_config(cls, config: Any) -> BaseModelSpec:
        """Build from a transformers ``PretrainedConfig`` (or its ``config.json`` as a dict)."""
        model_type = _field(config, "model_type")
        if not isinstance(model_type, str) or not model_type:
            raise ValueError("base model config has no model_type")
        architectures = _field(config, "architectures") or []
        architecture = architectures[0] if architectures else _DEFAULT_ARCHITECTURES.get(model_type)
        if not isinstance(architecture, str):
            raise ValueError(f"base model config lists no architecture for model_type {model_type!r}")
        hidden = _positive_int(config, "hidden_size")
        heads = _positive_int(config, "num_attention_heads")
        kv_heads = _field(config, "num_key_value_heads") or heads
        head_dim = _field(config, "head_dim") or hidden // heads
        return cls(
            architecture=architecture,
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=_positive_int(config, "intermediate_size"),
            num_hidden_layers=_positive_int(config, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=int(kv_heads),
            head_dim=int(head_dim),
            vocab_size=_positive_int(config, "vocab_size"),
        )

    def module_shape(self, module: str) -> tuple[int, int]:
        """``(in_features, out_features)`` of one projection, e.g. ``module_shape("k_proj")``."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_key_value_heads * self.head_dim
        shapes = {
            "q_proj": (self.hidden_size, q_out),
            "k_proj": (self.hidden_size, kv_out),
            "v_proj": (self.hidden_size, kv_out),
            "o_proj": (q_out, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }
        try:
            return shapes[module]
        except KeyError:
            raise ValueError(f"unknown projection {module!r}; expected one of {', '.join(LORA_MODULES)}") from None

    def module_keys(self) -> list[str]:
        """Names of every module of a Llama-family causal LM, as peft sees them when matching targets."""
        keys = ["model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head"]
        for i in range(self.num_hidden_layers):
            layer = f"model.layers.{i}"
            keys += [layer, f"{layer}.self_attn", f"{layer}.mlp", f"{layer}.mlp.act_fn"]
            keys += [f"{layer}.input_layernorm", f"{layer}.post_attention_layernorm"]
            keys += [f"{layer}.{block}.{module}" for module, block in MODULE_BLOCKS.items()]
        return keys
