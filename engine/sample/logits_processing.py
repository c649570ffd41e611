"""Penalties and logit bias on a step's raw logits, batched over the rows that ask for them.

vLLM's semantics: presence and frequency penalties count the generated tokens only (OpenAI's formula:
``logit - frequency * count - presence * (count > 0)``); the repetition penalty covers prompt and generated
tokens (the HF/CTRL formula: a positive logit is divided by it, a negative one multiplied); then each
``logit_bias`` entry is added. This runs before the grammar mask, so a mask always wins: a bias of +100 on a
token the grammar forbids leaves it forbidden (narrow, never widen).
"""

from __future__ import annotations

import torch

from loraplex.engine.core.sequence import Sequence


def token_counts(token_lists: list[list[int]], vocab: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[rows, vocab] occurrence counts: a scatter_add over the padded id tensor (padding goes to an extra column)."""
    width = max(1, max(len(ids) for ids in token_lists))
    padded = torch.full((len(token_lists), width), vocab, dtype=torch.long)
    for r, ids in enumerate(token_lists):
        if ids:
            padded[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    padded = padded.to(device, non_blocking=True)
    counts = torch.zeros((len(token_lists), vocab + 1), dtype=dtype, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=dtype))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Presence, frequency and repetition penalties on the rows (aligned with ``seqs``) that set any, in place."""
    rows = [r for r, s in enumerate(seqs) if s.params.needs_penalties]
    if not rows:
        return
    dev, dtype, vocab = logits.device, logits.dtype, logits.shape[1]
    params = [seqs[r].params for r in rows]
    index = torch.tensor(rows, dtype=torch.long, device=dev)
    x = logits.index_select(0, index)
    counts = token_counts([seqs[r].output_token_ids for r in rows], vocab, dev, dtype)
    generated = counts > 0
    if any(p.repetition_penalty != 1.0 for p in params):
        in_prompt = token_counts([seqs[r].prompt_token_ids for r in rows], vocab, dev, dtype) > 0
        rep = torch.tensor([p.repetition_penalty for p in params], dtype=dtype, device=dev).unsqueeze(1)
        penalty = torch.where(in_prompt | generated, rep, torch.ones_like(rep))
        x = torch.where(x > 0, x / penalty, x * penalty)
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=dtype, device=dev).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params], dtype=dtype, device=dev).unsqueeze(1)
    x = x - freq * counts - pres * generated.to(dtype)
    logits.index_copy_(0, index, x)


def apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Add each row's ``logit_bias`` entries (one index_put over all rows), in place."""
    rows: list[int] = []
    tokens: list[int] = []
    values: list[float] = []
    for r, seq in enumerate(seqs):
        bias = seq.params.logit_bias
        if bias:
            rows.extend([r] * len(bias))
            tokens.extend(bias.keys())
            values.extend(bias.values())
    if not rows:
        return
    dev = logits.device
    logits.index_put_(
        (torch.tensor(rows, dtype=torch.long, device=dev), torch.tensor(tokens, dtype=torch.long, device=dev)),
        torch.tensor(values, dtype=logits.dtype, device=dev),
        accumulate=True,
    )


def process_logits(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Penalties, then logit bias, on the raw logits of a step (in place)."""
    apply_penalties(logits, seqs)
    apply_logit_bias(logits, seqs)


def suppress_stops(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: set[int]) -> None:
    """Before min_tokens are out, EOS (unless ignore_eos) and stop token ids cannot be sampled."""
    for r, seq in enumerate(seqs):
        p = seq.params
        if p.min_tokens > seq.num_output_tokens:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else sorted(eos_token_ids))
            if banned:
                logits[r, banned] = float("-inf")
