"""Batched sampling: grammar masks, temperature, top-k, top-p, min-p, seeded draws, logprobs.

All rows are processed together; the only per-row Python work is drawing the random numbers of
seeded requests from their own generators, so a request's output depends on its seed alone and not
on whatever else shares the batch.

Sampling is an exponential race (argmax of p / E, E ~ Exp(1)); the runners-up of the same race are
draws without replacement. A `TokenCheck` uses that: a row whose sampled token fails the check takes
the next runner-up, which is a draw from the distribution with the rejected tokens removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from loraplex.engine.sample.sampling_params import SamplingParams


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None  # logprob of each sampled token (raw model distribution)
    top: list[list[tuple[int, float]]] | None  # per row, top-n (token, logprob)


class TokenCheck(Protocol):
    """Rows whose sampled token must pass `fits` (e.g. structured output under a tight budget)."""

    rows: list[int]

    def fits(self, row: int, token: int) -> bool: ...

    def fallback(self, row: int) -> int:
        """A token that always passes, for when no runner-up among the candidates does."""


CHECK_CANDIDATES = 8


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        check: TokenCheck | None = None,
    ) -> SampleResult:
        """logits: [N, V] float32, already grammar-masked; one params/generator per row."""
        n = logits.shape[0]
        want_logprobs = any(p.wants_token_logprobs for p in params)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None

        greedy = [p.greedy for p in params]
        keys = logits if all(greedy) else self._race_keys(logits, params, generators, greedy)
        sampled = keys.argmax(dim=-1)
        if check is not None and check.rows:
            sampled = self._apply_check(keys, sampled, check)

        token_ids = sampled.tolist()
        lp: list[float] | None = None
        top: list[list[tuple[int, float]]] | None = None
        if raw_logprobs is not None:
            lp = raw_logprobs.gather(1, sampled.view(-1, 1)).view(-1).tolist()
            k = max(p.logprobs or 0 for p in params)
            top = [[] for _ in range(n)]
            if k > 0:
                vals, idx = raw_logprobs.topk(k, dim=-1)
                vals_l, idx_l = vals.tolist(), idx.tolist()
                for r, p in enumerate(params):
                    m = p.logprobs or 0
                    top[r] = list(zip(idx_l[r][:m], vals_l[r][:m]))
        return SampleResult(token_ids, lp, top)

    @staticmethod
    def _apply_check(keys: torch.Tensor, sampled: torch.Tensor, check: TokenCheck) -> torch.Tensor:
        """Each checked row takes its best-ranked candidate that passes, else the check's fallback."""
        rows = check.rows
        k = min(CHECK_CANDIDATES, keys.shape[1])
        vals, idx = keys[rows].topk(k, dim=-1)
        vals_l, idx_l = vals.tolist(), idx.tolist()
        chosen = sampled.clone()
        for j, r in enumerate(rows):
            token = next((t for t, v in zip(idx_l[j], vals_l[j]) if v > float("-inf") and check.fits(r, t)), None)
            chosen[r] = check.fallback(r) if token is None else token
        return chosen

    def _race_keys(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        greedy: list[bool],
    ) -> torch.Tensor:
        """Per row, scores whose argmax is the sampled token and whose order ranks the runners-up.

        -inf marks tokens a row cannot draw (masked, or cut by top-k/top-p/min-p); greedy rows score
        by their logits.
        """
        dev = logits.device
        temps = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], device=dev)
        x = logits / temps.unsqueeze(1)
        if any(p.top_k > 0 for p in params) or any(p.top_p < 1.0 for p in params):
            x = _top_k_top_p(x, params)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=dev)
            probs = torch.softmax(x, dim=-1)
            thresh = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
            x = x.masked_fill(probs < thresh, float("-inf"))
        probs = torch.softmax(x, dim=-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) samples from p. Seeded rows draw E from
        # their own generator so the draw depends on nothing else in the batch.
        q = torch.empty_like(probs)
        seeded = [i for i, g in enumerate(generators) if g is not None]
        unseeded = [i for i, g in enumerate(generators) if g is None]
        if unseeded:
            q[unseeded] = torch.empty((len(unseeded), probs.shape[1]), device=dev).exponential_()
        for i in seeded:
            q[i].exponential_(generator=generators[i])
        keys = (probs / q).masked_fill_(probs == 0, float("-inf"))
        if any(greedy):
            g_rows = torch.tensor(greedy, device=dev).unsqueeze(1)
            keys = torch.where(g_rows, logits, keys)
        return keys


def _top_k_top_p(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    dev = x.device
    vocab = x.shape[1]
    ks = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=dev)
    ps = torch.tensor([p.top_p for p in params], device=dev, dtype=x.dtype)
    sorted_x, order = x.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=dev).unsqueeze(0)
    drop = ranks >= ks.unsqueeze(1)
    probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
    # keep the smallest prefix whose mass reaches top_p (the token crossing the threshold stays)
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= ps.unsqueeze(1)
    drop[:, 0] = False
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(1, order, sorted_x)
