"""Which decode steps run every layer in one C call (``kernels.decode_layers``), and the model's layers bound for it.

A one-stream decode step of a quantized model is ~270 small kernel calls; from Python each costs ~10 us more than
its work (a third of a SmolLM2 step), and each call wakes its thread team again. The C walk makes the same calls
on the same data (one thread team for the whole step below 8 rows), so it changes speed, never results. It runs a
step when every token of it is a single-token decode (in every KV-cache group; no invalid slot), no adapter is in
the batch, and the model is one it covers: the ``cpu-c`` backend, every projection GGUF blocks (a file's, or Q8_0
at load) with no bias (every family's block otherwise: per-head q/k norms, sandwich norms, SiLU or GELU gating,
sliding windows, soft-capping). Everything else runs the per-layer Python path, which is always there.
``LORAPLEX_DECODE_WALK=0`` turns the walk off.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from loraplex import envvars as env
from loraplex.engine.model.linear import QuantizedLinear
from loraplex.kernels.attention_plan import AttentionMetadata, CDecodePlan
from loraplex.kernels.decode_layers import DecodeLayers, GroupStep, WalkDims, WalkLayer, WalkUnsupported
from loraplex.kernels.quant import QuantWeight

if TYPE_CHECKING:
    from loraplex.engine.model.llama import DecoderModel

log = logging.getLogger(__name__)


def _parts(projection: object, what: str) -> list[QuantWeight]:
    if not isinstance(projection, QuantizedLinear) or projection.bias is not None:
        raise WalkUnsupported(f"{what} is not a quantized projection without bias")
    parts = [w for w in projection._weights if isinstance(w, QuantWeight)]
    if len(parts) != len(projection._weights):
        raise WalkUnsupported(f"{what} holds int8-per-channel parts")
    return parts


def build_decode_walk(model: DecoderModel) -> DecodeLayers | None:
    """The model's layers bound for the C walk, or None (logged at debug level: why) where it does not apply."""
    if not env.decode_walk_enabled():
        return None
    s = model.shape
    try:
        if model.backend.name != "cpu-c" or model.device.type != "cpu":
            raise WalkUnsupported(f"backend {model.backend.name} on {model.device.type}")
        layers = []
        for i, layer in enumerate(model.layers):
            layers.append(
                WalkLayer(
                    input_norm=layer.input_norm,
                    post_norm=layer.post_norm,
                    cos=layer.rotary.cos,
                    sin=layer.rotary.sin,
                    window=layer.window,
                    q_norm=layer.q_norm,
                    k_norm=layer.k_norm,
                    pre_ff_norm=layer.pre_ff_norm,
                    post_ff_norm=layer.post_ff_norm,
                    qkv=_parts(layer.qkv, f"layer {i}'s qkv"),
                    o=_parts(layer.o, f"layer {i}'s o"),
                    gate_up=_parts(layer.gate_up, f"layer {i}'s gate_up"),
                    down=_parts(layer.down, f"layer {i}'s down"),
                )
            )
        dims = WalkDims(
            hidden=s.hidden_size,
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            inter=s.intermediate_size,
            eps=s.rms_norm_eps,
            scale=model.scale,
            softcap=s.attn_softcap,
            gelu=model.gelu,
        )
        return DecodeLayers(layers, dims, model.dtype)
    except WalkUnsupported as exc:
        log.debug("decode steps run layer by layer from Python: %s", exc)
        return None


def walk_plan(
    meta: AttentionMetadata | list[AttentionMetadata],
) -> tuple[list[tuple[AttentionMetadata, CDecodePlan]], tuple[int, ...] | None] | None:
    """Where the walk can run the step (single-token decodes only, in row order, no invalid slot): each distinct
    KV-cache group's metadata and decode plan, and each layer's group (None: one group); else None."""
    if not isinstance(meta, list):
        plan = _decode_plan(meta)
        return None if plan is None else ([(meta, plan)], None)
    groups: list[tuple[AttentionMetadata, CDecodePlan]] = []
    layer_group: list[int] = []
    for layer_meta in meta:
        for g, (known, _) in enumerate(groups):
            if known is layer_meta:
                layer_group.append(g)
                break
        else:
            plan = _decode_plan(layer_meta)
            if plan is None:
                return None
            layer_group.append(len(groups))
            groups.append((layer_meta, plan))
    return groups, tuple(layer_group)


def _decode_plan(meta: AttentionMetadata) -> CDecodePlan | None:
    if not meta.slots_valid or len(meta.groups) != 1:
        return None
    plan = meta.groups[0]
    return plan if isinstance(plan, CDecodePlan) and plan.whole else None


def run_walk(
    walk: DecodeLayers,
    h: torch.Tensor,
    positions: torch.Tensor,
    step: tuple[list[tuple[AttentionMetadata, CDecodePlan]], tuple[int, ...] | None],
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The walk over a step ``walk_plan`` accepted; the last layer's MLP output."""
    groups, layer_group = step
    steps = [GroupStep(m.slot_mapping, plan.tables, plan.seq_lens, not plan.checked) for m, plan in groups]
    delta = walk.run(h, positions, steps, layer_group, kv_caches)
    for _, plan in groups:
        plan.checked = True  # (as the attention path: a step's tables are checked once)
    return delta
