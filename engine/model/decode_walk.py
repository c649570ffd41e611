"""Which decode steps run every layer in one C call (``kernels.decode_layers``), and the model's layers bound for it.

A one-stream decode step of a quantized model is ~270 small kernel calls; from Python each costs ~10 us more than
its work (a third of a SmolLM2 step). The C walk makes the same calls with the same arguments, so it changes
speed, never results. It runs a step when every token of it is a single-token decode (one KV-cache group, no
invalid slot), no adapter is in the batch, and the model is one it covers: the ``cpu-c`` backend, every
projection GGUF blocks (a file's, or Q8_0 at load) with no bias, and a Llama-shaped block (no per-head q/k norm,
no sandwich norms, SiLU-gated MLP). Everything else runs the per-layer Python path, which is always there.
``LORAPLEX_DECODE_WALK=0`` turns the walk off.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from loraplex import envvars as env
from loraplex.engine.model.linear import QuantizedLinear
from loraplex.kernels.attention_plan import AttentionMetadata, CDecodePlan
from loraplex.kernels.decode_layers import DecodeLayers, WalkDims, WalkLayer, WalkUnsupported
from loraplex.kernels.quant import QuantWeight

if TYPE_CHECKING:
    from loraplex.engine.model.llama import DecoderModel

log = logging.getLogger(__name__)


def _parts(projection: object, what: str) -> list[QuantWeight]:
    if not isinstance(projection, QuantizedLinear) or projection.bias is not None:
        raise WalkUnsupported(f"{what} is not a quantized projection without bias")
    weights = projection._weights
    if not all(isinstance(w, QuantWeight) for w in weights):
        raise WalkUnsupported(f"{what} holds int8-per-channel parts")
    return [w for w in weights if isinstance(w, QuantWeight)]


def build_decode_walk(model: DecoderModel) -> DecodeLayers | None:
    """The model's layers bound for the C walk, or None (logged at debug level: why) where it does not apply."""
    if not env.decode_walk_enabled():
        return None
    s = model.shape
    try:
        if model.backend.name != "cpu-c" or model.device.type != "cpu":
            raise WalkUnsupported(f"backend {model.backend.name} on {model.device.type}")
        if model.gelu:
            raise WalkUnsupported("a GeGLU MLP")
        layers = []
        for i, layer in enumerate(model.layers):
            if layer.q_norm is not None or layer.pre_ff_norm is not None or layer.post_ff_norm is not None:
                raise WalkUnsupported(f"layer {i} has per-head q/k norms or sandwich norms")
            layers.append(
                WalkLayer(
                    input_norm=layer.input_norm,
                    post_norm=layer.post_norm,
                    cos=layer.rotary.cos,
                    sin=layer.rotary.sin,
                    window=layer.window,
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
        )
        return DecodeLayers(layers, dims, model.dtype)
    except WalkUnsupported as exc:
        log.debug("decode steps run layer by layer from Python: %s", exc)
        return None


def walk_plan(meta: AttentionMetadata | list[AttentionMetadata]) -> CDecodePlan | None:
    """The step's decode plan where the walk can run it: single-token decodes only, in row order, one KV group."""
    if isinstance(meta, list) or not meta.slots_valid or len(meta.groups) != 1:
        return None
    plan = meta.groups[0]
    return plan if isinstance(plan, CDecodePlan) and plan.whole else None
