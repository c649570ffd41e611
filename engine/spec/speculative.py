"""Fewer decode steps, same outputs: n-gram (prompt-lookup) drafts and their verification rules.

**Drafts.** vLLM's ``ngram`` method: the last n tokens of prompt + output (n from ``prompt_lookup_max``
down to ``prompt_lookup_min``) are looked up earlier in the same context; the tokens that followed the
first match are the draft (at most ``num_speculative_tokens``). A constrained request's draft is cut
at the first token its grammar would refuse.

**Verification** (``engine.spec.settle.verify``): the scheduler computes a sequence's known tokens and its draft
as one multi-token row; the logits at the last known position and at each draft position are then sampled
*one position after another*, each with exactly what plain decoding would use there (penalties over the
output so far, min_tokens, the grammar mask of the matcher advanced by the tokens taken, the seeded
generator). Position j's token is taken like any sampled token; the next position is sampled only while
that token equals draft token j+1. The outputs are therefore those of plain decoding, token for token:
greedy takes the argmax at each position; for temperature > 0 the sampler's exponential race
(argmax p/E, E ~ Exp(1)) draws each position's token from p, and a seeded request's generator is advanced
once per taken token, as in plain decoding, so seeded outputs do not change either.

Why this is the rejection sampling of speculative decoding: for a deterministic draft d (q = one-hot(d)),
the standard rule accepts d with probability min(1, p(d)/q(d)) = p(d) and otherwise samples from
(p - q)+ renormalised, which is p with d removed, renormalised. The race does exactly that: its winner is d
with probability p(d), and given that the winner is not d it is distributed as p(t) / (1 - p(d)) over
t != d. So every position's token has law p whatever the draft, and the draft only decides how many
positions one forward pass covers.

**Draft sources** (``engine.spec.drafts``). Besides vLLM's token n-gram, two of our own, both on by default:
``grammar_drafts`` (a constrained request's draft starts with the text its grammar forces next: token-level
jump-forward cannot take such text when the grammar allows several tokenizations of it; as a draft it is
verified like any other, and the model keeps its own tokenization where it differs) and ``text_lookup``
(prompt lookup over text, not tokens: a value copied from the document is tokenized differently inside a
JSON string). Drafts never change what is sampled, only how many positions one pass covers.

**Policy.** Drafts cost compute in the verification pass. When more than ``disable_by_batch_size``
sequences run (vLLM's key), the batch is compute-bound and drafts would slow it: no drafts are proposed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

# Above this many running sequences no drafts are proposed: on CPU a decode step's cost grows with its
# token count once the batch is this large (bench/speculative.py measures it), so drafts no longer come free.
DEFAULT_DISABLE_BY_BATCH_SIZE = 4
_KEYS = (
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "disable_by_batch_size",
    "grammar_drafts",
    "text_lookup",
)


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE
    method: str = "ngram"
    # ours, not vLLM's (engine.spec.drafts): a constrained request's draft starts with the text its grammar forces, and
    # prompt lookup matches text before tokens
    grammar_drafts: bool = True
    text_lookup: bool = True

    @classmethod
    def parse(cls, raw: dict[str, Any] | str | None) -> SpeculativeConfig | None:
        """vLLM's ``speculative_config`` (a dict, or its JSON text from a flag); ValueError names what is wrong."""
        if raw is None or raw == "" or raw == {}:
            return None
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config must be a JSON object: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"speculative_config must be an object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(_KEYS))
        if unknown:
            raise ValueError(f"speculative_config: unsupported key {unknown[0]!r} (supported: {', '.join(_KEYS)})")
        method = raw.get("method")
        if method != "ngram":
            raise ValueError(f"speculative_config: method must be 'ngram' (the only one supported), got {method!r}")
        k = raw.get("num_speculative_tokens")
        lo, hi = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
        if lo is None and hi is None:
            lo = hi = 5  # vLLM's defaults
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        batch = raw.get("disable_by_batch_size", DEFAULT_DISABLE_BY_BATCH_SIZE)
        k, lo, hi, batch = (
            _positive_int(name, value)
            for name, value in (
                ("num_speculative_tokens", k),
                ("prompt_lookup_min", lo),
                ("prompt_lookup_max", hi),
                ("disable_by_batch_size", batch),
            )
        )
        if lo > hi:
            raise ValueError(f"speculative_config: prompt_lookup_min ({lo}) exceeds prompt_lookup_max ({hi})")
        flags = {name: raw.get(name, True) for name in ("grammar_drafts", "text_lookup")}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise ValueError(f"speculative_config: {name} must be true or false, got {value!r}")
        return cls(k, lo, hi, batch, **flags)


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"speculative_config: {name} must be a positive integer, got {value!r}")
    return value


def ngram_propose(context: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the first earlier occurrence of the context's longest suffix
    (between ``min_n`` and ``max_n`` tokens long); empty when none occurs."""
    size = len(context)
    if k <= 0 or size < min_n + 1:
        return []
    arr = np.asarray(context, dtype=np.int64)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = arr[size - n :]
        # windows starting at 0 .. size-n-1: every earlier occurrence, the suffix itself excluded
        windows = np.lib.stride_tricks.sliding_window_view(arr[: size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[0]) + n
            return [int(t) for t in arr[start : start + k]]
    return []
