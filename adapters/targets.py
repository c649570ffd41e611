"""Which (layer, module) pairs an adapter config targets, with peft's matching rules, and their rank/alpha.

peft matches names of the base model's modules as ``model.named_modules()`` gives them
(``model.layers.3.self_attn.q_proj``):
- ``target_modules`` as a string is a regex that must fullmatch the name (``layers_to_transform`` is
  then ignored); as a list, an entry matches the name itself or its dotted suffix, and
  ``layers_to_transform`` / ``layers_pattern`` then filter by layer index;
- ``exclude_modules`` likewise (regex fullmatch, or name / dotted suffix);
- ``rank_pattern`` / ``alpha_pattern`` keys are regexes tried in order with ``(.*\\.)?(key)$``;
  the first key that matches wins.
Tenant-supplied patterns run on the ``regex`` engine with a timeout, so a pathological pattern is
refused instead of hanging the upload.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from .config import AdapterConfig
from .errors import AdapterError
from .spec import ALL_LORA_MODULES, BaseModelSpec

_REGEX_TIMEOUT_S = 0.25
_EMBEDDING_MODULES = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class TargetModule:
    layer: int
    module: str  # short name, e.g. "q_proj"
    key: str  # peft's module name, e.g. "model.layers.3.self_attn.q_proj"
    rank: int
    alpha: float


def _search(pattern: str, key: str, what: str, *, full: bool) -> bool:
    try:
        fn = regex.fullmatch if full else regex.match
        return fn(pattern, key, timeout=_REGEX_TIMEOUT_S) is not None
    except regex.error as exc:
        raise AdapterError(
            f"invalid adapter_config.json: {what} {pattern!r} is not a valid regular expression ({exc})",
            code="invalid_config",
        ) from None
    except TimeoutError:
        raise AdapterError(
            f"invalid adapter_config.json: {what} {pattern!r} takes too long to match", code="invalid_config"
        ) from None


def _name_matches(names: tuple[str, ...], key: str) -> bool:
    return key in names or any(key.endswith(f".{name}") for name in names)


def _layer_index(config: AdapterConfig, key: str) -> int | None:
    if config.layers_pattern is None:
        patterns = [r".*?\.[^.]*\.(?P<idx>\d+)\."]
    else:
        patterns = [rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\." for p in config.layers_pattern]
    for pattern in patterns:
        try:
            found = regex.match(pattern, key, timeout=_REGEX_TIMEOUT_S)
        except (regex.error, TimeoutError):
            raise AdapterError(
                f"invalid adapter_config.json: layers_pattern {config.layers_pattern!r} is not usable",
                code="invalid_config",
            ) from None
        if found is not None:
            return int(found.group("idx"))
    return None


def is_targeted(config: AdapterConfig, key: str) -> bool:
    """peft's ``check_target_module_exists`` for one module name."""
    excluded = config.exclude_modules
    if isinstance(excluded, str):
        if _search(excluded, key, "exclude_modules", full=True):
            return False
    elif excluded and _name_matches(excluded, key):
        return False
    targets = config.target_modules
    if isinstance(targets, str):
        if targets.lower() == "all-linear":
            targets = ALL_LORA_MODULES  # resolve_targets keeps only the base model's own
        else:
            return _search(targets, key, "target_modules", full=True)
    if not _name_matches(targets, key):
        return False
    if config.layers_to_transform is None:
        return True
    return _layer_index(config, key) in config.layers_to_transform


def _pattern_value(patterns: dict[str, float], key: str, what: str) -> float | None:
    for pattern in patterns:
        if _search(rf"(.*\.)?({pattern})$", key, what, full=False):
            return patterns[pattern]
    return None


def resolve_targets(config: AdapterConfig, base: BaseModelSpec) -> dict[tuple[int, str], TargetModule]:
    """Every (layer, module) the config puts LoRA on, with its rank and alpha; refuses bad targets."""
    keys = base.module_keys()
    modules = base.lora_modules()
    if isinstance(config.target_modules, tuple):
        for name in config.target_modules:
            if not any(_name_matches((name,), key) for key in keys):
                raise AdapterError(
                    f"unknown target module {name!r}: a {base.architecture} model has no such module "
                    f"(LoRA is supported on {', '.join(modules)})",
                    code="unknown_target_module",
                )
    if config.layers_to_transform is not None:
        beyond = [i for i in config.layers_to_transform if i >= base.num_hidden_layers]
        if beyond:
            raise AdapterError(
                f"wrong base model: layers_to_transform names layer {beyond[0]} but the base model "
                f"has {base.num_hidden_layers} layers",
                code="wrong_base_model",
            )

    found: dict[tuple[int, str], TargetModule] = {}
    for key in keys:
        if not is_targeted(config, key):
            continue
        parts = key.split(".")
        if parts[-1] in _EMBEDDING_MODULES:
            raise AdapterError(
                f"LoRA on {parts[-1]} is not supported: adapters may not change the embeddings or the LM head",
                code="embedding_lora",
            )
        if len(parts) != 5 or parts[-1] not in modules:
            raise AdapterError(
                f"unknown target module {key!r}: LoRA is supported only on the projections {', '.join(modules)}",
                code="unknown_target_module",
            )
        rank = _pattern_value(config.rank_pattern, key, "rank_pattern key")
        alpha = _pattern_value(config.alpha_pattern, key, "alpha_pattern key")
        layer, module = int(parts[2]), parts[-1]
        found[(layer, module)] = TargetModule(
            layer=layer,
            module=module,
            key=key,
            rank=int(rank) if rank is not None else config.r,
            alpha=alpha if alpha is not None else config.lora_alpha,
        )
    if not found:
        raise AdapterError(
            f"unknown target modules: target_modules {config.target_modules!r} matches no projection of the base model",
            code="unknown_target_module",
        )
    return found
