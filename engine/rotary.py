"""Rotary position embeddings (rotate-half convention of Hugging Face's Llama), with rope scaling."""

from __future__ import annotations

import math

import torch

from loraplex.engine.config import ModelShape


def _inv_freq(shape: ModelShape) -> torch.Tensor:
    dim = shape.head_dim
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = shape.rope_scaling
    if scaling is None:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_mid, mid, scaled)
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3)")


class RotaryEmbedding:
    """Precomputed cos/sin tables [max_positions, head_dim] indexed by absolute position (applied by
    ``kernels.elementwise.rope_``)."""

    def __init__(self, shape: ModelShape, max_positions: int, device: torch.device, dtype: torch.dtype) -> None:
        inv = _inv_freq(shape)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(pos, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        # float32 throughout, like transformers, so positions rotate identically.
        self.cos = emb.float().cos().to(device=device, dtype=dtype)
        self.sin = emb.float().sin().to(device=device, dtype=dtype)
