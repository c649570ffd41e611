"""The sampler draws from the distribution its parameters define: temperature, top-k, top-p and min-p checked
against the softmax computed here (independently of the sampler's code), by the frequencies of many draws at
fixed seeds. Each token's frequency must lie within 5 standard errors of its probability (a fair sampler
fails that about once in 10^5 cells; the seeds are fixed, so the outcome is the same every run), and
tokens the parameters exclude must never be drawn."""

from __future__ import annotations

import math

import pytest
import torch

from loraplex.engine import SamplingParams
from loraplex.engine.sample.sampler import Sampler

DRAWS = 6000
# Eight tokens with well separated probabilities, so every filter below cuts at a known rank.
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.6, 0.2, -0.5, -1.0, -3.0])


def expected(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> list[float]:
    """The distribution vLLM's semantics define, computed in float64 by hand: scale, then keep the top-k
    tokens, then the smallest prefix whose mass reaches top_p, then tokens with at least min_p times the
    largest probability, renormalising after each cut."""
    logits = [float(x) / temperature for x in LOGITS]
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    kept = order[:top_k] if top_k > 0 else list(order)

    def probs(ids: list[int]) -> dict[int, float]:
        z = sum(math.exp(logits[i]) for i in ids)
        return {i: math.exp(logits[i]) / z for i in ids}

    p = probs(kept)
    mass, prefix = 0.0, []
    for i in kept:  # descending probability
        prefix.append(i)
        mass += p[i]
        if mass >= top_p:
            break
    p = probs(prefix)
    top = max(p.values())
    p = probs([i for i in prefix if p[i] >= min_p * top])
    return [p.get(i, 0.0) for i in range(len(logits))]


def frequencies(params: SamplingParams, seed: int) -> list[float]:
    torch.manual_seed(seed)
    logits = LOGITS.repeat(DRAWS, 1)
    tokens = Sampler(torch.device("cpu"))(logits, [params] * DRAWS, [None] * DRAWS).token_ids
    counts = torch.bincount(torch.tensor(tokens), minlength=len(LOGITS))
    return (counts.double() / DRAWS).tolist()


def assert_matches(observed: list[float], probs: list[float]) -> None:
    for token, (f, p) in enumerate(zip(observed, probs)):
        if p == 0.0:
            assert f == 0.0, f"token {token} is excluded but was drawn {f * DRAWS:.0f} times"
            continue
        se = math.sqrt(p * (1 - p) / DRAWS)
        assert abs(f - p) <= 5 * se, f"token {token}: frequency {f:.4f}, probability {p:.4f} (5 SE = {5 * se:.4f})"


CASES = {
    "plain": dict(temperature=1.0),
    "cold": dict(temperature=0.5),
    "hot": dict(temperature=2.0),
    "top_k": dict(temperature=1.0, top_k=3),
    "top_p": dict(temperature=1.0, top_p=0.8),
    "min_p": dict(temperature=1.0, min_p=0.2),
    "all": dict(temperature=0.7, top_k=6, top_p=0.9, min_p=0.05),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_draws_follow_the_filtered_softmax(name):
    kwargs = CASES[name]
    probs = expected(**kwargs)
    assert_matches(frequencies(SamplingParams(**kwargs), seed=sorted(CASES).index(name)), probs)


def test_the_cases_are_distinguishable():
    """Each filter changes the distribution by far more than the tolerance, so a sampler that ignored one
    of them would fail its case above."""
    plain = expected()
    for name, kwargs in CASES.items():
        if name == "plain":
            continue
        gap = max(abs(a - b) for a, b in zip(expected(**kwargs), plain))
        assert gap > 10 * math.sqrt(0.25 / DRAWS), name


def test_seeded_rows_do_not_depend_on_their_neighbours():
    sampler = Sampler(torch.device("cpu"))
    params = SamplingParams(temperature=1.0, seed=11)

    def draw(rows: int) -> int:
        logits = LOGITS.repeat(rows, 1)
        gens = [torch.Generator().manual_seed(11)] + [None] * (rows - 1)
        return sampler(logits, [params] + [SamplingParams(temperature=1.0)] * (rows - 1), gens).token_ids[0]

    assert len({draw(1), draw(5), draw(40)}) == 1
