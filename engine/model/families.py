"""The model families the native model serves, and the parts each one switches on.

One decoder implementation (``engine.model.llama``) serves every family; this table says which of its parts a
``model_type`` uses. Per-checkpoint settings (biases, soft-caps, windows, rope) are read from config.json by
``ModelShape``; what a family fixes regardless of the config is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraplex.adapters.spec import DEFAULT_ARCHITECTURES


@dataclass(frozen=True)
class Family:
    model_type: str
    qkv_bias: bool = False  # q/k/v projections always carry biases (Qwen2); others follow `attention_bias`
    qk_norm: bool = False  # per-head RMSNorm of q and k before the rotary embedding (Qwen3, Gemma 3)
    norm_offset: bool = False  # RMSNorm scales by (1 + w) (Gemma): folded into the weights at load
    sandwich_norms: bool = False  # extra norms after attention and around the MLP (Gemma 2 / 3)
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size) (Gemma)
    fused_weights: bool = False  # checkpoints store qkv_proj and gate_up_proj fused (Phi-3)
    activation_key: str = "hidden_act"  # the config key naming the MLP's activation
    default_activation: str = "silu"
    # How layers are split into sliding-window and global ones when config.json has no `layer_types`:
    # "all" (every layer slides when `sliding_window` is set), "qwen2" (use_sliding_window from
    # max_window_layers on), "even" (Gemma 2: even layers slide), "pattern" (Gemma 3: every
    # sliding_window_pattern-th layer is global), "none" (no sliding window).
    window_layout: str = "none"

    @property
    def architecture(self) -> str:
        """The transformers class a config of this model_type names."""
        return DEFAULT_ARCHITECTURES[self.model_type]


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama"),
        Family("mistral", window_layout="all"),
        Family("qwen2", qkv_bias=True, window_layout="qwen2"),
        Family("qwen3", qk_norm=True, window_layout="qwen2"),
        Family("phi3", fused_weights=True, window_layout="all"),
        Family(
            "gemma2",
            norm_offset=True,
            sandwich_norms=True,
            embed_scale=True,
            activation_key="hidden_activation",
            default_activation="gelu_pytorch_tanh",
            window_layout="even",
        ),
        Family(
            "gemma3_text",
            qk_norm=True,
            norm_offset=True,
            sandwich_norms=True,
            embed_scale=True,
            activation_key="hidden_activation",
            default_activation="gelu_pytorch_tanh",
            window_layout="pattern",
        ),
    )
}
ARCHITECTURES: dict[str, str] = {f.architecture: f.model_type for f in FAMILIES.values()}
# Activations the MLP's gated product takes, by transformers' names.
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


def supported() -> str:
    """What the error messages list: ``LlamaForCausalLM (llama), ...``."""
    return ", ".join(f"{f.architecture} ({f.model_type})" for f in FAMILIES.values())


def family_of(config: dict[str, Any]) -> Family:
    """The family of a config.json; ValueError listing what is supported otherwise."""
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    if model_type in FAMILIES:
        family = FAMILIES[model_type]
        unknown = [a for a in archs if a != family.architecture]
        if unknown:
            raise ValueError(
                f"architectures {unknown} with model_type {model_type!r}: loraplex serves {family.architecture} "
                f"for it (supported: {supported()})"
            )
        return family
    if model_type is None and len(archs) == 1 and archs[0] in ARCHITECTURES:
        return FAMILIES[ARCHITECTURES[archs[0]]]
    raise ValueError(
        f"unsupported architecture {archs or model_type!r} (model_type {model_type!r}): loraplex serves {supported()}"
    )
