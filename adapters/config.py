"""Reading adapter_config.json and refusing what loraplex cannot serve."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import AdapterError
from .json_depth import DEFAULT_MAX_JSON_DEPTH, exceeds_depth

# Every LoraConfig field of peft 0.21 (plus a few older ones). An option not listed here that is set
# to something truthy is refused: a future peft feature may change the forward pass.
_KNOWN_FIELDS = {
    "task_type",
    "peft_type",
    "auto_mapping",
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
    "r",
    "target_modules",
    "exclude_modules",
    "lora_alpha",
    "lora_dropout",
    "fan_in_fan_out",
    "bias",
    "use_rslora",
    "modules_to_save",
    "init_lora_weights",
    "layers_to_transform",
    "layers_pattern",
    "rank_pattern",
    "alpha_pattern",
    "megatron_config",
    "megatron_core",
    "trainable_token_indices",
    "loftq_config",
    "eva_config",
    "corda_config",
    "lora_ga_config",
    "use_dora",
    "velora_config",
    "alora_invocation_tokens",
    "use_qalora",
    "qalora_group_size",
    "monteclora_config",
    "layer_replication",
    "runtime_config",
    "lora_bias",
    "target_parameters",
    "use_bdlora",
    "arrow_config",
    "kasa_config",
    "ensure_weight_tying",
    "enable_lora",
    "merge_weights",
}
# LoRA variants whose forward pass is not plain x @ A.T @ B.T * scaling, or whose weights do not live
# in lora_A / lora_B; refused when set.
_UNSUPPORTED_VARIANTS = {
    "lora_bias": "LoRA bias (lora_bias)",
    "target_parameters": "LoRA on parameters (target_parameters)",
    "layer_replication": "layer replication (layer_replication)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "arrow_config": "Arrow routing (arrow_config)",
    "kasa_config": "KaSA (kasa_config)",
    "monteclora_config": "MonteCLoRA (monteclora_config)",
    "loftq_config": "LoftQ, which changes the base weights (loftq_config)",
    "enable_lora": "merged-linear LoRA (enable_lora)",
}
# init_lora_weights values after which the adapter only fits base weights modified at init time.
_BASE_MODIFYING_INITS = ("pissa", "olora", "corda", "lora_ga", "loftq")


@dataclass(frozen=True)
class AdapterConfig:
    """The parts of a peft LoraConfig that decide which modules get LoRA and how it is scaled."""

    r: int
    lora_alpha: float
    use_rslora: bool
    target_modules: str | tuple[str, ...]  # a regex (peft: fullmatch) or a tuple of names
    exclude_modules: str | tuple[str, ...] | None = None
    layers_to_transform: tuple[int, ...] | None = None
    layers_pattern: tuple[str, ...] | None = None
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    base_model_name_or_path: str | None = None
    base_model_class: str | None = None
    use_dora: bool = False  # DoRA: each module's output rows rescaled by magnitude / ||W + scaling * B @ A||


def _invalid(detail: str) -> AdapterError:
    return AdapterError(f"invalid adapter_config.json: {detail}", code="invalid_config")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _names(value: Any, key: str, *, allow_str: bool) -> str | tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not allow_str:
            return (value,)
        return value
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise _invalid(f"{key} must be a list of module names{' or a regular expression' if allow_str else ''}")


def parse_adapter_config(raw: bytes, *, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH) -> AdapterConfig:
    """Parse the file's bytes; raise AdapterError naming the first unsupported or invalid setting."""
    if exceeds_depth(raw, max_json_depth):
        raise AdapterError(
            f"adapter_config.json nests arrays and objects deeper than {max_json_depth} levels "
            "(the limit max_json_depth)",
            code="invalid_config",
        )
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AdapterError(f"adapter_config.json is not valid JSON: {exc}", code="invalid_config") from None
    if not isinstance(data, dict):
        raise _invalid("the top level must be a JSON object")
    _refuse_unsupported(data)
    return _read_lora_fields(data)


def _refuse_unsupported(data: dict[str, Any]) -> None:
    peft_type = data.get("peft_type")
    if peft_type != "LORA":
        raise AdapterError(
            f'peft_type {peft_type!r} is not supported; only LoRA adapters (peft_type "LORA") are',
            code="unsupported_peft_type",
        )
    if data.get("task_type") not in (None, "CAUSAL_LM"):
        raise AdapterError(
            f"task_type {data['task_type']!r} is not supported; only CAUSAL_LM adapters are",
            code="unsupported_option",
        )
    if data.get("use_dora") and data.get("megatron_config"):
        raise AdapterError("DoRA (use_dora) with megatron_config is not supported (peft refuses it too)", code="dora")
    if data.get("modules_to_save"):
        raise AdapterError(
            f"modules_to_save {data['modules_to_save']!r} is not supported: the adapter would replace "
            "whole base-model modules, not just add LoRA weights",
            code="modules_to_save",
        )
    if data.get("trainable_token_indices"):
        raise AdapterError(
            "trainable_token_indices is not supported: adapters may not add tokens or change the embeddings",
            code="added_tokens",
        )
    for key, label in _UNSUPPORTED_VARIANTS.items():
        if data.get(key):
            raise AdapterError(f"{label} is not supported", code="unsupported_option")
    init = data.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_MODIFYING_INITS):
        raise AdapterError(
            f"init_lora_weights {init!r} is not supported: such an adapter only fits base weights modified "
            "at initialisation; convert it to a plain LoRA adapter first",
            code="unsupported_option",
        )
    for key, value in data.items():
        if key not in _KNOWN_FIELDS and value:
            raise AdapterError(f"unknown adapter option {key!r} is set; it is not supported", code="unsupported_option")


def _read_lora_fields(data: dict[str, Any]) -> AdapterConfig:
    r, alpha = data.get("r"), data.get("lora_alpha", 8)
    if not _is_rank(r):
        raise _invalid(f"r must be a positive integer, got {r!r}")
    if not _is_number(alpha):
        raise _invalid(f"lora_alpha must be a finite number, got {alpha!r}")
    use_rslora = data.get("use_rslora", False)
    if not isinstance(use_rslora, bool):
        raise _invalid(f"use_rslora must be true or false, got {use_rslora!r}")
    use_dora = data.get("use_dora", False)
    if not isinstance(use_dora, bool):
        raise _invalid(f"use_dora must be true or false, got {use_dora!r}")

    target = data.get("target_modules")
    if target is None or target == [] or target == "":
        raise _invalid("target_modules is missing or empty")
    target_modules = _names(target, "target_modules", allow_str=True)
    assert target_modules is not None

    layers = data.get("layers_to_transform")
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if layers is not None and not (
        isinstance(layers, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)
    ):
        raise _invalid(f"layers_to_transform must be a layer index or a list of them, got {layers!r}")

    rank_pattern = data.get("rank_pattern") or {}
    alpha_pattern = data.get("alpha_pattern") or {}
    if not isinstance(rank_pattern, dict) or not all(
        isinstance(k, str) and _is_rank(v) for k, v in rank_pattern.items()
    ):
        raise _invalid("rank_pattern must map module patterns to positive integer ranks")
    if not isinstance(alpha_pattern, dict) or not all(
        isinstance(k, str) and _is_number(v) for k, v in alpha_pattern.items()
    ):
        raise _invalid("alpha_pattern must map module patterns to finite numbers")

    base_name = data.get("base_model_name_or_path")
    if base_name is not None and not isinstance(base_name, str):
        raise _invalid("base_model_name_or_path must be a string")
    auto_mapping = data.get("auto_mapping") or {}
    base_class = auto_mapping.get("base_model_class") if isinstance(auto_mapping, dict) else None

    layers_pattern = _names(data.get("layers_pattern") or None, "layers_pattern", allow_str=False)
    return AdapterConfig(
        r=r,
        lora_alpha=float(alpha),
        use_rslora=use_rslora,
        target_modules=target_modules,
        exclude_modules=_names(data.get("exclude_modules"), "exclude_modules", allow_str=True),
        layers_to_transform=tuple(layers) if layers else None,
        layers_pattern=layers_pattern if layers_pattern else None,
        rank_pattern=dict(rank_pattern),
        alpha_pattern={k: float(v) for k, v in alpha_pattern.items()},
        base_model_name_or_path=base_name or None,
        base_model_class=base_class if isinstance(base_class, str) else None,
        use_dora=use_dora,
    )
