"""The native decoder model over the paged KV cache (no Hugging Face modeling code at run time).

One implementation serves every family of ``engine.model.families`` (Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3):
the family and config.json (``ModelShape``) switch its parts on: q/k/v biases, per-head q/k norms, Gemma's
(1 + w) norms (folded into the weights at load), pre/post "sandwich" norms, embedding scaling, GeGLU,
attention and final-logit soft-capping, per-layer sliding windows and Gemma 3's local rotary base.

Weights are fused at load time (or loaded fused, as Phi-3 stores them): q/k/v into one `qkv` projection and
gate/up into one `gate_up` projection, so each layer runs four matmuls. The model works on a flat batch of
tokens from many sequences (prefill chunks and decodes together); attention reads and writes the paged cache
through the per-step metadata, and an optional per-step LoRA context adds adapter deltas per token.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from safetensors import safe_open

from loraplex.engine.errors import ModelLoadError
from loraplex.engine.model.decode_walk import build_decode_walk, run_walk, walk_plan
from loraplex.engine.model.gguf_weights import GGUFWeights, QuantTensor
from loraplex.engine.model.linear import (
    AT_LOAD,
    Linear,
    Projection,
    QuantizedLinear,
    QuantPart,
    float_weight,
    quantize_at_load,
)
from loraplex.engine.model.rotary import RotaryEmbedding
from loraplex.engine.model.shape import ModelShape
from loraplex.kernels.attention_plan import AttentionMetadata, attention
from loraplex.kernels.backend import ComputeBackend


class LoRAContext(Protocol):
    """Adds adapter deltas for one layer and projection group (qkv, o, gate_up, down), in place."""

    def apply(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None: ...


class DecoderLayer:
    def __init__(
        self,
        w: dict[str, torch.Tensor],
        projections: dict[str, Projection],
        window: int | None,
        rotary: RotaryEmbedding,
    ) -> None:
        self.input_norm = w["input_layernorm"]
        self.post_norm = w["post_attention_layernorm"]
        self.pre_ff_norm = w.get("pre_feedforward_layernorm")  # sandwich norms (Gemma 2 / 3)
        self.post_ff_norm = w.get("post_feedforward_layernorm")
        self.q_norm, self.k_norm = w.get("q_norm"), w.get("k_norm")
        self.qkv = projections["qkv"]
        self.o = projections["o"]
        self.gate_up = projections["gate_up"]
        self.down = projections["down"]
        self.window = window
        self.rotary = rotary


class DecoderModel:
    def __init__(
        self,
        shape: ModelShape,
        embed: torch.Tensor | QuantTensor,
        layers: list[DecoderLayer],
        norm: torch.Tensor,
        lm_head: Projection,
        backend: ComputeBackend,
    ) -> None:
        self.shape = shape
        self.backend = backend
        self.embed = embed  # rows looked up per token: floats, or blocks de-quantized row by row
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.device, self.dtype = norm.device, norm.dtype
        self.scale = shape.query_scale if shape.query_scale is not None else shape.head_dim**-0.5
        # Gemma multiplies the embeddings by sqrt(hidden_size), rounded to the model's dtype first
        self.embed_scale = (
            torch.tensor(shape.hidden_size**0.5, dtype=self.dtype, device=self.device)
            if shape.family.embed_scale
            else None
        )
        self.gelu = shape.activation == "gelu_pytorch_tanh"
        # decode-only steps without adapters run every layer in one C call where the model allows (the same bits)
        self.decode_walk = build_decode_walk(self)

    def embed_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed, QuantTensor):
            return self.embed.take_rows(input_ids).dequantize(self.dtype)
        return F.embedding(input_ids, self.embed)

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (every projection and the LM head; one embedding row aside)."""
        per_layer = sum(
            p.weight_bytes for layer in self.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)
        )
        return per_layer + self.lm_head.weight_bytes

    def _qk_norm(self, qkv: torch.Tensor, layer: DecoderLayer) -> None:
        """Per-head RMSNorm of the q and k heads of ``qkv``, in place (Qwen3, Gemma 3)."""
        s, norm = self.shape, self.backend.add_rms_norm
        q_size, kv_size, d = s.q_size, s.kv_size, s.head_dim
        # one contiguous row per head (with a single head the reshape alone would be a strided view)
        q = qkv[:, :q_size].reshape(-1, d).contiguous()
        k = qkv[:, q_size : q_size + kv_size].reshape(-1, d).contiguous()
        qkv[:, :q_size] = norm(q, None, layer.q_norm, s.rms_norm_eps).view(-1, q_size)
        qkv[:, q_size : q_size + kv_size] = norm(k, None, layer.k_norm, s.rms_norm_eps).view(-1, kv_size)

    def _act_mul(self, gu: torch.Tensor, inter: int) -> torch.Tensor:
        if self.gelu:  # GeGLU (Gemma): transformers' gelu_pytorch_tanh
            return self.backend.gelu_mul(gu, inter)
        return self.backend.silu_mul(gu, inter)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata | list[AttentionMetadata],
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        lora: LoRAContext | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [T, hidden], for a flat batch of T tokens. ``meta``: one for
        every layer, or one per layer (KV-cache groups: each layer reads its group's block tables)."""
        if isinstance(meta, list) and len(meta) != len(self.layers):
            raise ValueError(f"{len(meta)} attention metadata for {len(self.layers)} layers")
        s = self.shape
        add_rms_norm, rope_ = self.backend.add_rms_norm, self.backend.rope_
        eps = s.rms_norm_eps
        h = self.embed_rows(input_ids)  # the residual stream, updated in place by add_rms_norm
        if self.embed_scale is not None:
            h = h * self.embed_scale
        walk = self.decode_walk
        step = walk_plan(meta) if walk is not None and lora is None else None
        if step is not None and walk is not None:
            return add_rms_norm(h, run_walk(walk, h, positions, step, kv_caches), self.norm, eps)
        # the shape's numbers once per forward, not per layer (each is a property lookup)
        q_size, kv_size = s.q_size, s.kv_size
        qk_end = q_size + kv_size
        heads, kv_heads, head_dim = s.num_heads, s.num_kv_heads, s.head_dim
        rope_heads = heads + kv_heads
        inter = s.intermediate_size
        softcap = s.attn_softcap
        scale = self.scale
        metas = meta if isinstance(meta, list) else [meta] * len(self.layers)
        delta: torch.Tensor | None = None  # the previous layer's MLP output, added to h by the next norm
        for i, layer in enumerate(self.layers):
            x = add_rms_norm(h, delta, layer.input_norm, eps)
            qkv = layer.qkv(x)
            if lora is not None:
                lora.apply(i, "qkv", x, qkv)
            if layer.q_norm is not None:
                self._qk_norm(qkv, layer)
            # q and k heads, in place; the positions are the same in every layer, checked in the first
            rotary = layer.rotary
            rope_(qkv, rope_heads, head_dim, rotary.cos, rotary.sin, positions, check_positions=i == 0)
            q = qkv[:, :q_size].view(-1, heads, head_dim)
            k = qkv[:, q_size:qk_end].view(-1, kv_heads, head_dim)
            v = qkv[:, qk_end:].view(-1, kv_heads, head_dim)
            k_cache, v_cache = kv_caches[i]
            layer_meta = metas[i]
            inputs = layer_meta.paged_inputs(q, k_cache, v_cache, scale, window=layer.window, softcap=softcap)
            a = attention(inputs, k, v, layer_meta).view(-1, q_size)
            o = layer.o(a)
            if lora is not None:
                lora.apply(i, "o", a, o)
            if layer.pre_ff_norm is not None:  # Gemma: norm the attention output, then the MLP input
                o = add_rms_norm(o, None, layer.post_norm, eps)
                x = add_rms_norm(h, o, layer.pre_ff_norm, eps)
            else:
                x = add_rms_norm(h, o, layer.post_norm, eps)
            gu = layer.gate_up(x)
            if lora is not None:
                lora.apply(i, "gate_up", x, gu)
            m = self._act_mul(gu, inter)
            delta = layer.down(m)
            if lora is not None:
                lora.apply(i, "down", m, delta)
            if layer.post_ff_norm is not None:
                delta = add_rms_norm(delta, None, layer.post_ff_norm, eps)
        return add_rms_norm(h, delta, self.norm, eps)

    def group_weight(self, layer: int, group: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A projection group's (``qkv``, ``o``, ``gate_up``, ``down``) weight as float32 ``[out, in]`` (a new
        tensor for packed or quantized weights) and its bias: DoRA's row norms at adapter load."""
        projection: Projection = getattr(self.layers[layer], group)
        return float_weight(projection), projection.bias

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.shape.final_softcap
        if cap is not None:  # Gemma 2, in transformers' order
            logits = torch.tanh(logits / cap) * cap
        return logits.float()


# ------------------------------------------------------------------------------------------ loading
def _open_weights(model_dir: Path) -> dict[str, tuple[Path, str]]:
    """tensor name -> (file, name); reads headers only."""
    index: dict[str, tuple[Path, str]] = {}
    files = sorted(model_dir.glob("*.safetensors"))
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                    index[name] = (f, name)
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise ModelLoadError(f"cannot read weights file {f.name}: {exc}") from exc
    return index


def load_model(
    model_dir: Path,
    shape: ModelShape,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    backend: ComputeBackend,
    quantization: str | None = None,
    gguf: Path | None = None,
    int8_activations: bool = False,
) -> DecoderModel:
    """Load any family's checkpoint into the one decoder; sliding windows at least ``max_positions`` long
    are full attention and run as such. ``quantization`` (EngineArgs): "gguf" keeps the blocks of ``gguf`` (the
    file ``model_dir`` was converted from) for every projection the file quantized; "q8_0" quantizes every
    projection at load to Q8_0 blocks, "int8" to int8 per output channel; None or "none": float weights in
    ``dtype``. ``int8_activations`` (EngineArgs.quantized_activations "int8"): the quantized projections quantize
    x per group of 32 to int8 (llama.cpp's method)."""
    family = shape.family
    if quantization == "gguf" and gguf is None:
        raise ModelLoadError(f"quantization 'gguf' needs a GGUF model; {model_dir} was not converted from one")
    blocks = GGUFWeights(gguf, shape.num_layers) if quantization == "gguf" and gguf is not None else None
    index = _open_weights(model_dir)
    handles: dict[Path, Any] = {}  # safetensors' safe_open handles (typed as object in its stubs)

    def get(name: str) -> torch.Tensor:
        for key in (name, "model." + name if not name.startswith("lm_head") else name):
            if key in index:
                f, real = index[key]
                if f not in handles:
                    handles[f] = safe_open(str(f), framework="pt")
                try:
                    t: torch.Tensor = handles[f].get_tensor(real)
                except Exception as exc:
                    raise ModelLoadError(f"cannot read tensor {real} from {f.name}: {exc}") from exc
                return t
        raise ModelLoadError(f"{model_dir} lacks weight '{name}' (is this a {family.architecture} checkpoint?)")

    def put(t: torch.Tensor, expect: tuple[int, ...], name: str) -> torch.Tensor:
        if tuple(t.shape) != expect:
            raise ModelLoadError(f"weight {name} has shape {tuple(t.shape)}, config implies {expect}")
        if not torch.isfinite(t).all():
            raise ModelLoadError(f"weight {name} contains NaN or Inf")
        return t.to(device=device, dtype=dtype).contiguous()

    def norm(name: str, size: int) -> torch.Tensor:
        w = get(name)
        if family.norm_offset:  # Gemma's (1 + w), in float32 as transformers computes it
            w = 1.0 + w.float()
        return put(w, (size,), name)

    def projection(
        names: list[str],
        expect: tuple[int, int],
        label: str,
        bias: torch.Tensor | None,
        heads: list[int | None] | None = None,
    ) -> Projection:
        """The projection of the stacked weights ``names`` (fused in this order), quantized or float. ``heads``:
        per name, the head count of a q or k weight (a GGUF file may reorder their rows), else None."""
        parts: list[QuantPart | None] = []
        if blocks is not None:
            for name, h in zip(names, heads or [None] * len(names)):
                parts.append(blocks.projection("model." + name, h, functools.partial(get, name)))
        elif quantization in AT_LOAD:
            parts = [quantize_at_load(get(name), quantization) for name in names]
        if parts and all(q is not None for q in parts):
            quantized = QuantizedLinear([q.to(device) for q in parts if q is not None], bias, int8_activations)
            if (quantized.out_features, quantized.in_features) != expect:
                got = (quantized.out_features, quantized.in_features)
                raise ModelLoadError(f"weight {label} has shape {got}, config implies {expect}")
            return quantized
        weight = torch.cat([get(name) for name in names]) if len(names) > 1 else get(names[0])
        return Linear(put(weight, expect, label), bias)

    hs, inter, d = shape.hidden_size, shape.intermediate_size, shape.head_dim
    qkv_rows = shape.q_size + 2 * shape.kv_size
    qkv_bias = family.qkv_bias or shape.attention_bias
    embed_blocks = blocks.quantized("model.embed_tokens.weight") if blocks is not None else None
    embed: torch.Tensor | QuantTensor
    if embed_blocks is not None:
        if (embed_blocks.rows, embed_blocks.k) != (shape.vocab_size, hs):
            raise ModelLoadError(f"embed_tokens has shape {(embed_blocks.rows, embed_blocks.k)}")
        embed = embed_blocks.to(device)
    else:
        embed = put(get("embed_tokens.weight"), (shape.vocab_size, hs), "embed_tokens.weight")
    rotary = RotaryEmbedding(shape.rope, d, shape.rope_max_positions, max_positions, device, dtype)
    local_rotary = rotary
    if shape.local_rope is not None:  # Gemma 3: sliding layers rotate with their own parameters
        local_rotary = RotaryEmbedding(shape.local_rope, d, shape.rope_max_positions, max_positions, device, dtype)
    windows = shape.windows_for(max_positions)
    layers = []
    for i in range(shape.num_layers):
        p = f"layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        if family.fused_weights:
            qkv_names, gate_up_names = [a + "qkv_proj.weight"], [m + "gate_up_proj.weight"]
            qkv_heads: list[int | None] | None = None
        else:
            qkv_names = [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]
            gate_up_names = [m + "gate_proj.weight", m + "up_proj.weight"]
            qkv_heads = [shape.num_heads, shape.num_kv_heads, None]
        w = {
            "input_layernorm": norm(p + "input_layernorm.weight", hs),
            "post_attention_layernorm": norm(p + "post_attention_layernorm.weight", hs),
        }
        if family.sandwich_norms:
            w["pre_feedforward_layernorm"] = norm(p + "pre_feedforward_layernorm.weight", hs)
            w["post_feedforward_layernorm"] = norm(p + "post_feedforward_layernorm.weight", hs)
        if family.qk_norm:
            w["q_norm"] = norm(a + "q_norm.weight", d)
            w["k_norm"] = norm(a + "k_norm.weight", d)
        if qkv_bias:
            bias = torch.cat([get(a + "q_proj.bias"), get(a + "k_proj.bias"), get(a + "v_proj.bias")])
            w["qkv_bias"] = put(bias, (qkv_rows,), p + "qkv bias")
        if shape.attention_bias:
            w["o_bias"] = put(get(a + "o_proj.bias"), (hs,), a + "o_proj.bias")
        if shape.mlp_bias:
            w["gate_up_bias"] = put(
                torch.cat([get(m + "gate_proj.bias"), get(m + "up_proj.bias")]), (2 * inter,), p + "gate_up bias"
            )
            w["down_bias"] = put(get(m + "down_proj.bias"), (hs,), m + "down_proj.bias")
        projections = {
            "qkv": projection(qkv_names, (qkv_rows, hs), p + "qkv", w.pop("qkv_bias", None), qkv_heads),
            "o": projection([a + "o_proj.weight"], (hs, shape.q_size), p + "o_proj", w.pop("o_bias", None)),
            "gate_up": projection(gate_up_names, (2 * inter, hs), p + "gate_up", w.pop("gate_up_bias", None)),
            "down": projection([m + "down_proj.weight"], (hs, inter), p + "down_proj", w.pop("down_bias", None)),
        }
        sliding = shape.layer_windows[i] is not None if shape.layer_windows else False
        layers.append(DecoderLayer(w, projections, windows[i], local_rotary if sliding else rotary))
    final_norm = norm("norm.weight", hs)
    lm_head: Projection
    if shape.tie_word_embeddings or "lm_head.weight" not in index:
        if not shape.tie_word_embeddings:
            raise ModelLoadError(f"{model_dir} lacks lm_head.weight and the config does not tie embeddings")
        if isinstance(embed, QuantTensor):
            if int8_activations and embed.interleavable():  # one copy of the blocks, laid out for the LM head's
                embed = embed.interleave()  # products; the embedding looks its rows up there (take_rows)
            lm_head = QuantizedLinear([embed], None, int8_activations, interleave=False)  # (embed's own blocks)
        elif quantization in AT_LOAD:
            lm_head = QuantizedLinear([quantize_at_load(embed, quantization).to(device)], None, int8_activations)
        else:
            lm_head = Linear(embed)
    else:
        lm_head_blocks = blocks.quantized("lm_head.weight") if blocks is not None else None
        if lm_head_blocks is not None:
            lm_head = QuantizedLinear([lm_head_blocks.to(device)], None, int8_activations)
        elif quantization in AT_LOAD:
            lm_head = projection(["lm_head.weight"], (shape.vocab_size, hs), "lm_head.weight", None)
        else:
            lm_head = Linear(put(get("lm_head.weight"), (shape.vocab_size, hs), "lm_head.weight"))
    return DecoderModel(shape, embed, layers, final_norm, lm_head, backend)
