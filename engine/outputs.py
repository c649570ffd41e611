"""What the engine hands back for each request after a step."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from loraplex.engine.field_logprobs import FieldLogprob
    from loraplex.grammar.grounding import GroundedValue

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
    # fewer decode steps (engine.spec.speculative): n-gram draft tokens verified, those accepted, and tokens the
    # grammar forced (jump-forward), so far
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_forced_tokens: int = 0
    # with field_logprobs, once finished: per leaf of the JSON output (by JSON pointer), its tokens' logprobs
    field_logprobs: dict[str, FieldLogprob] | None = None
    # with grounded values (x-loraplex-grounded), once finished: where each came from in the source text
    grounded_values: list[GroundedValue] | None = None
    # a reasoning request's reasoning so far (its text and new_text are then the content only); None: none
    reasoning: str | None = None
    new_reasoning: str = ""

    def then(self, later: RequestOutput) -> RequestOutput:
        """This output followed by `later` of the same request, as one output (what a consumer that did not
        take this one in time receives): `later`'s cumulative state, both deltas joined."""
        return replace(
            later,
            new_text=self.new_text + later.new_text,
            new_reasoning=self.new_reasoning + later.new_reasoning,
            new_token_ids=self.new_token_ids + later.new_token_ids,
            new_logprobs=None
            if self.new_logprobs is None and later.new_logprobs is None
            else (self.new_logprobs or []) + (later.new_logprobs or []),
            prompt_logprobs=later.prompt_logprobs if later.prompt_logprobs is not None else self.prompt_logprobs,
        )

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
