"""Conversion of a loaded adapter into the engine's stacked per-layer LoRA layout."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .errors import AdapterError
from .loader import MAX_LORA_GAIN, LoadedAdapter
from .spec import BaseModelSpec

# The engine's fused projections and the LoRA slices each one carries, in output order.
LORA_GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}

# The base model's weight of one (layer, group) as floats [out_total, in_features] (a tensor the caller may free)
# and its bias: what DoRA's row norms are computed from (the engine's DecoderModel.group_weight).
BaseWeights = Callable[[int, str], tuple[torch.Tensor, torch.Tensor | None]]


def stack_adapter(
    adapter: LoadedAdapter,
    base: BaseModelSpec,
    max_rank: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """``{(layer, group): (A, B)}`` for every layer the adapter touches and every group in LORA_GROUPS.

    A is ``[num_slices, max_rank, in_features]``; B is ``[sum of slice out_features, max_rank]`` with
    the slices' rows concatenated in group order and each slice's scaling folded in, so that for
    slice ``i`` the delta is ``(x @ A[i].T) @ B[rows_i].T``. Modules the adapter lacks and ranks below
    ``max_rank`` are zero. Layers without any LoRA are omitted.
    """
    if adapter.rank > max_rank:
        raise AdapterError(f"adapter rank {adapter.rank} exceeds max_rank {max_rank}", code="rank_too_large")
    out: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in adapter.layers:
        for group, modules in LORA_GROUPS.items():
            in_features = base.module_shape(modules[0])[0]
            outs = [base.module_shape(m)[1] for m in modules]
            a_stack = torch.zeros(len(modules), max_rank, in_features, dtype=dtype, device=device)
            b_stack = torch.zeros(sum(outs), max_rank, dtype=dtype, device=device)
            row = 0
            for i, (module, out_features) in enumerate(zip(modules, outs)):
                w = adapter.weights.get((layer, module))
                if w is not None:
                    r = w.a.shape[0]
                    a_stack[i, :r] = w.a.to(device=device, dtype=dtype)
                    # Scale in float32 (or wider) before rounding to the serving dtype.
                    wide = torch.promote_types(w.b.dtype, torch.float32)
                    b_stack[row : row + out_features, :r] = (w.b.to(device=device, dtype=wide) * w.scaling).to(dtype)
                row += out_features
            out[(layer, group)] = (a_stack, b_stack)
    return out


def dora_scale(
    adapter: LoadedAdapter, base: BaseModelSpec, layer: int, group: str, weight: torch.Tensor
) -> torch.Tensor | None:
    """DoRA's per-output-row factor for one fused group: ``m / ||W + scaling * B @ A||`` (the norm over the input
    dimension, as peft's ``DoraLinearLayer.get_weight_norm``), 1 on the rows of modules without a magnitude;
    None when no module of the group has one.

    ``weight``: the group's base weight ``[out_total, in_features]`` (rows in LORA_GROUPS order) as floats. With it
    peft's DoRA output ``base + (f - 1) * base + f * scaling * lora`` is ``f * (base + delta)``: the engine adds
    the delta as for plain LoRA, then multiplies the rows by ``f``. Computed in float32 (or wider) on the
    weight's device.
    """
    parts = [adapter.weights.get((layer, m)) for m in LORA_GROUPS[group]]
    if all(w is None or w.magnitude is None for w in parts):
        return None
    wide = torch.promote_types(weight.dtype, torch.float32)
    scale = torch.ones(weight.shape[0], dtype=wide, device=weight.device)
    row = 0
    for module, w in zip(LORA_GROUPS[group], parts):
        rows = base.module_shape(module)[1]
        if w is not None and w.magnitude is not None:
            delta = w.b.to(weight.device, wide) @ w.a.to(weight.device, wide)
            norm = torch.linalg.norm(weight[row : row + rows].to(wide) + w.scaling * delta, dim=1)
            scale[row : row + rows] = w.magnitude.to(weight.device, wide) / norm
        row += rows
    return scale


def bounded_dora_scale(
    adapter: LoadedAdapter, base: BaseModelSpec, layer: int, group: str, weight: torch.Tensor
) -> torch.Tensor | None:
    """``dora_scale``, refused (``scale_too_large``) when a factor is over MAX_LORA_GAIN, or NaN (a zero row of
    ``W + scaling * B @ A``): the output times such a factor could overflow float32 arithmetic."""
    scale = dora_scale(adapter, base, layer, group, weight)
    if scale is None:
        return None
    largest = float(scale.abs().max())
    if not largest <= MAX_LORA_GAIN:  # NaN too
        raise AdapterError(
            f"layers.{layer}: a DoRA factor magnitude / ||W + scaling * B @ A|| of the {group} projection "
            f"is {largest:g}, over the bound of 2^32 (a magnitude far above its row's norm, or a zero row)",
            code="scale_too_large",
        )
    return scale


def dora_groups(adapter: LoadedAdapter) -> list[tuple[int, str]]:
    """The (layer, group) pairs where some module of the adapter has a DoRA magnitude vector."""
    return [
        (layer, group)
        for layer in adapter.layers
        for group, modules in LORA_GROUPS.items()
        if any(getattr(adapter.weights.get((layer, m)), "magnitude", None) is not None for m in modules)
    ]


def check_dora_factors(adapter: LoadedAdapter, base: BaseModelSpec, base_weights: BaseWeights) -> None:
    """Refuse the adapter if any DoRA factor is over the bound (``bounded_dora_scale``), computed against the base
    weights one group at a time (each float copy freed before the next)."""
    for layer, group in dora_groups(adapter):
        weight, _bias = base_weights(layer, group)
        bounded_dora_scale(adapter, base, layer, group, weight)
        del weight
