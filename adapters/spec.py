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
# Projections some families store fused (Phi-3): the fused module, its block and the slices it stacks in
# output order. peft adapters on such a model target the fused module; the loader splits its lora_B by rows.
FUSED_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "qkv_proj": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "gate_up_proj": ("mlp", ("gate_proj", "up_proj")),
}
FUSED_MODEL_TYPES = frozenset({"phi3"})
# Every module name an adapter may target on some family, in the engine's order.
ALL_LORA_MODULES: tuple[str, ...] = ("qkv_proj", *LORA_MODULES[:4], "gate_up_proj", *LORA_MODULES[4:])

# The causal-LM class of each model_type the engine serves (engine.model.families), also the name for configs that
# do not list `architectures` (e.g. a LlamaConfig built in code).
DEFAULT_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


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
        architecture = architectures[0] if architectures else DEFAULT_ARCHITECTURES.get(model_type)
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

    @property
    def fused(self) -> bool:
        """The model holds qkv_proj and gate_up_proj fused (Phi-3), and adapters target those."""
        return self.model_type in FUSED_MODEL_TYPES

    def lora_modules(self) -> tuple[str, ...]:
        """The projections adapters may target on this model, as peft names them."""
        if self.fused:
            return ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
        return LORA_MODULES

    def module_block(self, module: str) -> str:
        return FUSED_MODULES[module][0] if module in FUSED_MODULES else MODULE_BLOCKS[module]

    def module_shape(self, module: str) -> tuple[int, int]:
        """``(in_features, out_features)`` of one projection, e.g. ``module_shape("k_proj")``."""
        if module in FUSED_MODULES:
            slices = [self.module_shape(m) for m in FUSED_MODULES[module][1]]
            return slices[0][0], sum(out for _, out in slices)
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
            raise ValueError(f"unknown projection {module!r}; expected one of {', '.join(ALL_LORA_MODULES)}") from None

    def module_keys(self) -> list[str]:
        """Names of every module of the causal LM, as peft sees them when matching targets."""
        keys = ["model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head"]
        for i in range(self.num_hidden_layers):
            layer = f"model.layers.{i}"
            keys += [layer, f"{layer}.self_attn", f"{layer}.mlp", f"{layer}.mlp.act_fn"]
            keys += [f"{layer}.input_layernorm", f"{layer}.post_attention_layernorm"]
            keys += [f"{layer}.{self.module_block(module)}.{module}" for module in self.lora_modules()]
        return keys
