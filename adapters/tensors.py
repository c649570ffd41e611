"""Mapping the tensor names in adapter_model.safetensors to (layer, module, A|B), refusing the rest."""

from __future__ import annotations

import re

from .errors import AdapterError
from .spec import FUSED_MODULES, MODULE_BLOCKS

_BLOCKS = {**MODULE_BLOCKS, **{module: block for module, (block, _) in FUSED_MODULES.items()}}

# What peft's save_pretrained writes for LoRA on a Llama-family causal LM (adapter name stripped).
_LORA_NAME = re.compile(
    r"base_model\.model\.model\.layers\.(?P<layer>0|[1-9]\d*)\.(?P<block>self_attn|mlp)\."
    r"(?P<module>[a-z_]+)\.(?:lora_(?P<ab>[AB])\.weight|(?P<magnitude>lora_magnitude_vector))"
)


def parse_tensor_name(name: str) -> tuple[int, str, str]:
    """``(layer, module, "A" | "B" | "M")`` for a LoRA weight or a DoRA magnitude vector ("M"); AdapterError
    naming why any other tensor is refused."""
    m = _LORA_NAME.fullmatch(name)
    if m is not None:
        module = m["module"]
        if _BLOCKS.get(module) == m["block"]:
            return int(m["layer"]), module, "M" if m["magnitude"] else m["ab"]
        raise AdapterError(
            f"unknown target module in tensor {name!r}: LoRA is supported only on {', '.join(_BLOCKS)}",
            code="unknown_target_module",
        )
    raise _refusal(name)


def _refusal(name: str) -> AdapterError:
    if "trainable_tokens" in name:
        return AdapterError(
            f"adapters may not add tokens or change the embeddings (tensor {name!r})", code="added_tokens"
        )
    if "embed_tokens" in name or "lm_head" in name or "lora_embedding" in name:
        if "lora_" in name or ".base_layer." in name:  # base_layer: the module was wrapped by LoRA
            return AdapterError(
                f"LoRA on embed_tokens or lm_head is not supported (tensor {name!r})", code="embedding_lora"
            )
        return AdapterError(
            f"the adapter carries embedding weights (tensor {name!r}): added tokens or resized embeddings "
            "are not supported",
            code="added_tokens",
        )
    if "modules_to_save" in name:
        return AdapterError(f"modules_to_save weights are not supported (tensor {name!r})", code="modules_to_save")
    if name.endswith((".lora_B.bias", ".lora_A.bias")):
        return AdapterError(f"LoRA bias is not supported (tensor {name!r})", code="unsupported_option")
    if ".lora_A." in name or ".lora_B." in name:
        return AdapterError(
            f"unknown target module in tensor {name!r}: expected "
            "base_model.model.model.layers.<i>.<self_attn|mlp>.<projection>.lora_<A|B>.weight",
            code="unknown_target_module",
        )
    return AdapterError(f"unexpected tensor {name!r}: only LoRA A/B weights are accepted", code="unexpected_tensor")
