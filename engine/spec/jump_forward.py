"""Jump-forward: tokens a constrained request's grammar forces are appended without sampling and computed as
one chunk next step.

Rules:

* Only while the batch is small (``EngineArgs.jump_forward_max_running``): a compute-bound batch computes the
  forced tokens either way, as a chunk instead of one per step.
* Never for a request asking for logprobs or field_logprobs: a forced token's logprob is the sampler's to report,
  so such requests sample every token.
* Never across EOS or a stop token id: those end the request the sampler's way.
* Token level (``tokens``, lossless): each token is the only one its mask allows, so the sampler could take
  no other. A seeded sampled request's generator draws what plain sampling would have drawn for each, so its
  later draws stay the same.
* Byte level (``bytes``, opt-in, not lossless: ``EngineArgs.jump_forward_bytes``): the canonical tokenization
  of the text the grammar forces next, without its last token (it could merge with what the model writes
  after it) unless the text ends the output. Each token is one the sampler could have taken: allowed by the
  mask under the request's budget (and, where the backend asks, fitting the budget). The seeded generator
  draws nothing for them: later draws differ from plain sampling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from loraplex.engine.core.sequence import Sequence
from loraplex.engine.outputs import FinishReason
from loraplex.engine.structured import StructuredOutputManager

# appends a forced token to the sequence; the reason it finished the request, if it did
TakeForced = Callable[[Sequence, int], FinishReason | None]


class JumpForward:
    def __init__(
        self,
        tokenizer: Any,
        structured: StructuredOutputManager,
        eos_token_ids: set[int],
        vocab_size: int,
        device: torch.device,
        take: TakeForced,
    ) -> None:
        self.tokenizer = tokenizer
        self.structured = structured
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.device = device
        self.take = take

    def tokens(self, seq: Sequence) -> FinishReason | None:
        """Append the tokens the grammar forces after the last taken one."""
        m = seq.grammar
        p = seq.params
        if m is None or p.wants_token_logprobs or p.structured is None:
            return None
        budget = p.structured.close_within_budget
        while True:
            token = m.forced_token(seq.remaining_tokens if budget else None)
            if token is None or token in self.eos_token_ids or token in p.stop_token_ids:
                return None
            if seq.generator is not None and not p.greedy:
                # the draw plain sampling makes for this position (the sampler's exponential race)
                row = torch.empty(self.vocab_size, dtype=torch.float32, device=self.device)
                row.exponential_(generator=seq.generator)
            reason = self.take(seq, token)
            if reason:
                return reason

    def bytes(self, seq: Sequence) -> FinishReason | None:
        """Append the tokenization of the text the grammar forces next (see the module's rules)."""
        m = seq.grammar
        p = seq.params
        if m is None or p.wants_token_logprobs:
            return None
        text, complete = self.structured.forced_text(seq)
        if not text:
            return None
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        if not complete:
            tokens = tokens[:-1]
        tokens = tokens[: m.valid_prefix(tokens)]
        if not tokens:
            return None
        budget = p.structured is not None and p.structured.close_within_budget and seq.remaining_tokens is not None
        row = torch.empty(m.bitmask_words(), dtype=torch.int32) if budget else None
        for token in tokens:
            if token in self.eos_token_ids or token in p.stop_token_ids:
                return None
            if row is not None and not fits_budget(seq, row, token):
                return None
            reason = self.take(seq, token)
            if reason:
                return reason
        return None


def fits_budget(seq: Sequence, row: torch.Tensor, token: int) -> bool:
    """Whether the sampler could take ``token`` now under the request's budget: its mask bit is set and, where
    the matcher asks for the check, the output still closes within max_tokens after it."""
    m = seq.grammar
    remaining = seq.remaining_tokens
    assert m is not None and remaining is not None  # (a constrained sequence under a budget)
    m.fill_bitmask(row, remaining)
    if not (int(row[token // 32]) >> (token % 32)) & 1:
        return False
    return not m.needs_budget_check() or m.fits_budget(token, remaining - 1)
