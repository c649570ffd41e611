"""Native Llama-family model over the paged KV cache (no Hugging Face modeling code at run time).

Weights are fused at load time: q/k/v into one `qkv` projection and gate/up into one `gate_up`
projection, so each layer runs four matmuls. The model works on a flat batch of tokens from many
sequences (prefill chunks and decodes together); attention reads and writes the paged cache through
the per-step metadata, and an optional per-step LoRA context adds adapter deltas per token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from safetensors import safe_open

from loraplex.engine.config import ModelShape
from loraplex.engine.errors import ModelLoadError
from loraplex.engine.linear import Linear
from loraplex.engine.rotary import RotaryEmbedding
from loraplex.kernels.attention_plan import AttentionMetadata, attention
from loraplex.kernels.backend import ComputeBackend


class LoRAContext(Protocol):
    """Adds adapter deltas for one layer and projection group (qkv, o, gate_up, down), in place."""

    def apply(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None: ...


class LlamaLayer:
    def __init__(self, shape: ModelShape, w: dict[str, torch.Tensor]) -> None:
        self.shape = shape
        self.input_norm = w["input_layernorm"]
        self.post_norm = w["post_attention_layernorm"]
        self.qkv = Linear(w["qkv"])
        self.o = Linear(w["o"])
        self.gate_up = Linear(w["gate_up"])
        self.down = Linear(w["down"])


class LlamaModel:
    def __init__(
        self,
        shape: ModelShape,
        embed: torch.Tensor,
        layers: list[LlamaLayer],
        norm: torch.Tensor,
        lm_head: torch.Tensor,
        rotary: RotaryEmbedding,
        backend: ComputeBackend,
    ) -> None:
        self.shape = shape
        self.backend = backend
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = Linear(lm_head)
        self.rotary = rotary
        self.scale = shape.head_dim**-0.5

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        lora: LoRAContext | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [T, hidden], for a flat batch of T tokens."""
        s = self.shape
        add_rms_norm, rope_, silu_mul = self.backend.add_rms_norm, self.backend.rope_, self.backend.silu_mul
        eps = s.rms_norm_eps
        h = F.embedding(input_ids, self.embed)  # the residual stream, updated in place by add_rms_norm
        cos, sin = self.rotary.cos, self.rotary.sin
        q_size, kv_size = s.q_size, s.kv_size
        inter = s.intermediate_size
        delta: torch.Tensor | None = None  # the previous layer's MLP output, added to h by the next norm
        for i, layer in enumerate(self.layers):
            x = add_rms_norm(h, delta, layer.input_norm, eps)
            qkv = layer.qkv(x)
            if lora is not None:
                lora.apply(i, "qkv", x, qkv)
            # q and k heads, in place; the positions are the same in every layer, checked in the first
            rope_(qkv, s.num_heads + s.num_kv_heads, s.head_dim, cos, sin, positions, check_positions=i == 0)
            q = qkv[:, :q_size].view(-1, s.num_heads, s.head_dim)
            k = qkv[:, q_size : q_size + kv_size].view(-1, s.num_kv_heads, s.head_dim)
            v = qkv[:, q_size + kv_size :].view(-1, s.num_kv_heads, s.head_dim)
            k_cache, v_cache = kv_caches[i]
            a = attention(q, k, v, k_cache, v_cache, meta, self.scale).view(-1, q_size)
            o = layer.o(a)
            if lora is not None:
                lora.apply(i, "o", a, o)
            x = add_rms_norm(h, o, layer.post_norm, eps)
            gu = layer.gate_up(x)
            if lora is not None:
                lora.apply(i, "gate_up", x, gu)
            m = silu_mul(gu, inter)
            delta = layer.down(m)
            if lora is not None:
                lora.apply(i, "down", m, delta)
        return add_rms_norm(h, delta, self.norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


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


def load_llama(
    model_dir: Path,
    shape: ModelShape,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    backend: ComputeBackend,
) -> LlamaModel:
    index = _open_weights(model_dir)
    handles: dict[Path, object] = {}

    def get(name: str) -> torch.Tensor:
        for key in (name, "model." + name if not name.startswith("lm_head") else name):
            if key in index:
                f, real = index[key]
                if f not in handles:
                    handles[f] = safe_open(str(f), framework="pt")
                try:
                    t = handles[f].get_tensor(real)  # type: ignore[attr-defined]
                except Exception as exc:
                    raise ModelLoadError(f"cannot read tensor {real} from {f.name}: {exc}") from exc
                return t
        raise ModelLoadError(f"{model_dir} lacks weight '{name}' (is this a Llama checkpoint?)")

    def put(t: torch.Tensor, expect: tuple[int, ...], name: str) -> torch.Tensor:
        if tuple(t.shape) != expect:
            raise ModelLoadError(f"weight {name} has shape {tuple(t.shape)}, config implies {expect}")
        if not torch.isfinite(t).all():
            raise ModelLoadError(f"weight {name} contains NaN or Inf")
        return t.to(device=device, dtype=dtype).contiguous()

    hs, inter = shape.hidden_size, shape.intermediate_size
    embed = put(get("embed_tokens.weight"), (shape.vocab_size, hs), "embed_tokens.weight")
    layers = []
    for i in range(shape.num_layers):
        p = f"layers.{i}."
        qkv = torch.cat(
            [get(p + "self_attn.q_proj.weight"), get(p + "self_attn.k_proj.weight"), get(p + "self_attn.v_proj.weight")]
        )
        gate_up = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
        w = {
            "input_layernorm": put(get(p + "input_layernorm.weight"), (hs,), p + "input_layernorm"),
            "post_attention_layernorm": put(get(p + "post_attention_layernorm.weight"), (hs,), p + "post_norm"),
            "qkv": put(qkv, (shape.q_size + 2 * shape.kv_size, hs), p + "qkv"),
            "o": put(get(p + "self_attn.o_proj.weight"), (hs, shape.q_size), p + "o_proj"),
            "gate_up": put(gate_up, (2 * inter, hs), p + "gate_up"),
            "down": put(get(p + "mlp.down_proj.weight"), (hs, inter), p + "down_proj"),
        }
        layers.append(LlamaLayer(shape, w))
    norm = put(get("norm.weight"), (hs,), "norm.weight")
    if shape.tie_word_embeddings or "lm_head.weight" not in index:
        if not shape.tie_word_embeddings:
            raise ModelLoadError(f"{model_dir} lacks lm_head.weight and the config does not tie embeddings")
        lm_head = embed
    else:
        lm_head = put(get("lm_head.weight"), (shape.vocab_size, hs), "lm_head.weight")
    rotary = RotaryEmbedding(shape, max_positions, device, dtype)
    return LlamaModel(shape, embed, layers, norm, lm_head, rotary, backend)
