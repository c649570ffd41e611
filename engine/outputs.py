"""What the engine hands back for each request after a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)
    rank: int | None = None  # the token's rank in its distribution (1: the most likely); prompt logprobs only


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    text: str  # cumulative
    token_ids: list[int]  # cumulative
    new_text: str  # since the previous output of this request
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None  # cumulative
    new_logprobs: list[TokenLogprob] | None = None
    num_cached_tokens: int = 0
    error: str | None = None  # set with finish_reason "error"
    # A constrained request's narrowing ("keyword at pointer: how"; empty: enforced exactly); None: unconstrained
    narrowing: tuple[str, ...] | None = None
    # with prompt_logprobs: one entry per prompt token, None for the first (nothing predicts it); raw model logprobs
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # fewer decode steps (engine.speculative): n-gram draft tokens verified, those accepted, and tokens the
    # grammar forced (jump-forward), so far
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_forced_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
