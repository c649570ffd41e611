"""Rows of a step's logits that cannot be sampled: a NaN or +infinity, or all -infinity (e.g. an adapter whose
weights overflow float arithmetic). Raw logits are finite for any sane model, so such a row is its request's
fault: that request fails and the others of the step sample as usual."""

from __future__ import annotations

import torch

from loraplex.engine.core.sequence import Sequence


def non_finite_rows(logits: torch.Tensor) -> list[int]:
    """Indices of the rows that cannot be sampled. One reduction per row (the row maximum propagates NaN), far
    cheaper than testing every logit."""
    finite = torch.isfinite(logits.amax(dim=-1))
    if bool(finite.all()):
        return []
    return (~finite).nonzero().flatten().tolist()


def non_finite_error(seq: Sequence) -> str:
    where = f"LoRA adapter {seq.adapter_hash}" if seq.adapter_hash else "the base model"
    return (
        f"the model produced non-finite logits (NaN or infinity) for this request under {where}; "
        "no token could be sampled"
    )
