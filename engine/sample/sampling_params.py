"""Per-request sampling parameters, validated when the request is created."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loraplex.engine.errors import RequestError

# torch.Generator.manual_seed takes any signed or unsigned 64-bit value
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1

if TYPE_CHECKING:
    from loraplex.grammar.grounding import SourceText
    from loraplex.grammar.spec import StructuredSpec


@dataclass
class SamplingParams:
    max_tokens: int | None = 16  # None: up to max_model_len
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs per generated token (0: only the sampled one)
    min_tokens: int = 0
    structured: StructuredSpec | None = None
    skip_special_tokens: bool = True
    # applied to the raw logits before any grammar mask (engine/sample/logits_processing.py), vLLM's semantics
    presence_penalty: float = 0.0  # subtracted once from each token the output holds (OpenAI)
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output (OpenAI)
    repetition_penalty: float = 1.0  # tokens of prompt or output: positive logits divided, negative multiplied
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    prompt_logprobs: int | None = None  # logprobs of the prompt's tokens (and this many top ones per position)
    # per leaf of a JSON constraint's output, its tokens' logprobs (engine/field_logprobs.py); every token is then
    # sampled (no jump-forward), as with logprobs
    field_logprobs: bool = False
    # the request's source text: a schema's x-loraplex-grounded strings may only be spans of it (grammar/grounding.py);
    # the platform passes the user messages' text (each with its index in the request), or the prompt
    grounding_sources: tuple[SourceText, ...] | None = None
    # the output may reason first (a chat request on an engine with a reasoning parser: engine/reasoning.py): it is
    # split into reasoning and content, and a constraint applies to the content
    reasoning: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def wants_token_logprobs(self) -> bool:
        """The sampled tokens' logprobs are recorded (asked for, or needed for field_logprobs)."""
        return self.logprobs is not None or self.field_logprobs

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def validate(self) -> None:
        def bad(msg: str) -> RequestError:
            return RequestError(msg)

        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens <= 0):
            raise bad(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not (0.0 <= float(self.temperature) <= 100.0):
            raise bad(f"temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if not (0.0 <= float(self.min_p) <= 1.0):
            raise bad(f"min_p must be in [0, 1], got {self.min_p}")
        if self.logprobs is not None and not (0 <= self.logprobs <= 20):
            raise bad(f"logprobs must be between 0 and 20, got {self.logprobs}")
        if self.field_logprobs and (self.structured is None or self.structured.kind not in ("json", "json_object")):
            raise RequestError(
                "field_logprobs needs a JSON constraint: response_format json_schema or json_object, guided_json, "
                "or tools with tool_choice required or a named function",
                field="field_logprobs",
            )
        if self.prompt_logprobs is not None and not (0 <= self.prompt_logprobs <= 20):
            raise bad(f"prompt_logprobs must be between 0 and 20, got {self.prompt_logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (-2.0 <= float(getattr(self, name)) <= 2.0):
                raise bad(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not (0.0 < float(self.repetition_penalty) <= 1e6):
            raise bad(f"repetition_penalty must be in (0, 1e6], got {self.repetition_penalty}")
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise bad(f"logit_bias keys must be token ids (non-negative integers), got {token!r}")
            if not (-100.0 <= float(bias) <= 100.0):
                raise bad(f"logit_bias values must be in [-100, 100], got {bias} for token {token}")
        if self.min_tokens < 0:
            raise bad(f"min_tokens must be >= 0, got {self.min_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop strings must be non-empty strings")
        if len(self.stop) > 16:
            raise bad(f"at most 16 stop strings are allowed, got {len(self.stop)}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad(f"seed must be an integer, got {self.seed!r}")
        if self.seed is not None and not (SEED_MIN <= self.seed <= SEED_MAX):
            raise bad(f"seed must be within 64 bits, [{SEED_MIN}, {SEED_MAX}] (what torch takes), got {self.seed}")
