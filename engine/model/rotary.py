"""Rotary position embeddings (rotate-half convention of Hugging Face's Llama), with rope scaling.

The scaling types follow transformers' ``modeling_rope_utils`` (the tests compare with its
``ROPE_INIT_FUNCTIONS``): ``linear``, ``dynamic``, ``yarn``, ``llama3`` and ``longrope`` (``su`` is its old
name). Two of them depend in transformers on the length of the sequence being run, which a paged cache
cannot follow (keys cached under one table would be read under another), so they are served where they are
fixed, exactly (narrowed, never approximated):

* ``dynamic`` (NTK): transformers keeps the unscaled frequencies up to ``max_position_embeddings``; the
  engine's contexts never exceed that, so the unscaled table is the exact one.
* ``longrope``: transformers uses ``short_factor`` while a sequence fits in
  ``original_max_position_embeddings`` and ``long_factor`` beyond; the engine serves up to that length
  (``ModelShape.max_position_embeddings`` is narrowed to it) with the short factors.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv: torch.Tensor, rope: dict[str, Any]) -> torch.Tensor:
    factor = float(rope["factor"])
    low = float(rope.get("low_freq_factor", 1.0))
    high = float(rope.get("high_freq_factor", 4.0))
    old_len = float(rope["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, mid, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rope: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    theta = rope["rope_theta"]
    original = rope["original_max_position_embeddings"]
    factor = rope.get("factor") or max_positions / original
    attention = rope.get("attention_factor")
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if attention is None:
        if mscale and mscale_all_dim:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)
    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # the extrapolation's share
    return interpolation * (1 - keep) + extrapolation * keep, float(attention)


def _longrope(rope: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    original = rope["original_max_position_embeddings"]
    factor = rope.get("factor") or max_positions / original
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(rope["short_factor"], dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * rope["rope_theta"] ** shape), float(attention)


def inv_freq(rope: dict[str, Any], head_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2], attention scaling of cos/sin) for one set of rotary parameters
    (``ModelShape.rope``); ``max_positions`` is config.json's max_position_embeddings, which yarn and
    longrope read."""
    kind, theta = rope["rope_type"], rope["rope_theta"]
    if kind in ("default", "dynamic"):
        return _base_inv_freq(theta, head_dim), 1.0
    if kind == "linear":
        return _base_inv_freq(theta, head_dim) / float(rope["factor"]), 1.0
    if kind == "llama3":
        return _llama3(_base_inv_freq(theta, head_dim), rope), 1.0
    if kind == "yarn":
        return _yarn(rope, head_dim, max_positions)
    if kind == "longrope":
        return _longrope(rope, head_dim, max_positions)
    raise ValueError(f"unsupported rope scaling type {kind!r}")


class RotaryEmbedding:
    """Precomputed cos/sin tables [max_positions, head_dim] indexed by absolute position (applied by
    the backend's ``rope_``: ``kernels.elementwise.rope_c`` or ``rope_ref``)."""

    def __init__(
        self,
        rope: dict[str, Any],
        head_dim: int,
        config_max_positions: int,
        max_positions: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        inv, attention = inv_freq(rope, head_dim, config_max_positions)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(pos, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        # float32 throughout, like transformers, so positions rotate identically.
        self.cos = (emb.float().cos() * attention).to(device=device, dtype=dtype)
        self.sin = (emb.float().sin() * attention).to(device=device, dtype=dtype)
