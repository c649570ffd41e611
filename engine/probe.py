"""Opt-in observation of engine steps, for tests and benchmarks (``LLMEngine.probe``).

Serving runs without a probe: the hot paths only test the attribute for None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

LogitsCallback = Callable[[list[str], list[int], torch.Tensor], None]


@dataclass
class EngineProbe:
    # (request ids, output positions, raw logits [N, V]) of every sampling step, before masks and sampling
    on_logits: LogitsCallback | None = None
    # the same after penalties, logit bias, min_tokens and grammar masks: what the sampler draws from (before
    # temperature, top-k, top-p, min-p) and what reported logprobs are computed from
    on_processed_logits: LogitsCallback | None = None
    # seconds of each constrained row's mask fill, and of each budget check of a sampled token
    time_structured: bool = False
    mask_seconds: list[float] = field(default_factory=list)
    check_seconds: list[float] = field(default_factory=list)
