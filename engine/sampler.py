"""Batched sampling: grammar masks, temperature, top-k, top-p, min-p, seeded draws, logprobs.

All rows are processed together; the only per-row Python work is drawing the random numbers of
seeded requests from their own generators, so a request's output depends on its seed alone and not
on whatever else shares the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.sampling_params import SamplingParams


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None  # logprob of each sampled token (raw model distribution)
    top: list[list[tuple[int, float]]] | None  # per row, top-n (token, logprob)


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> SampleResult:
        """logits: [N, V] float32, already grammar-masked; one params/generator per row."""
        n = logits.shape[0]
        want_logprobs = any(p.logprobs is not None for p in params)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None

        greedy = [p.greedy for p in params]
        if all(greedy):
            sampled = logits.argmax(dim=-1)
        else:
            sampled = self._sample(logits, params, generators, greedy)

        token_ids = sampled.tolist()
        lp = top = None
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

    def _sample(self, logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None], greedy: list[bool]) -> torch.Tensor:
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
        sampled = (probs / q).argmax(dim=-1)
        if any(greedy):
            g_rows = torch.tensor(greedy, device=dev)
            sampled = torch.where(g_rows, logits.argmax(dim=-1), sampled)
        return sampled


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
