"""The token budget of a step shared by several tenants (EngineArgs.multi_tenant_step_ms), learned from step
times: a running average of seconds per token over steps large enough for their fixed costs not to dominate
(decode-only steps of a few dozen rows cost several times more per token, and would cut prompts into slivers).
The scheduler reads ``value`` (None: no cut yet, or none asked for)."""

from __future__ import annotations

from dataclasses import dataclass

TOKEN_CAP_MIN_STEP_TOKENS = 128  # steps that inform the multi-tenant token cap's seconds per token


@dataclass
class StepStats:
    num_tokens: int = 0
    num_seqs: int = 0
    seconds: float = 0.0


class TokenCap:
    def __init__(self, step_s: float | None = None, value: int | None = None) -> None:
        self.step_s = step_s  # the step time to aim at; None: never cut
        self.value = value
        self._seconds_per_token: float | None = None

    def observe(self, step: StepStats) -> None:
        if self.step_s is None or step.num_tokens < TOKEN_CAP_MIN_STEP_TOKENS:
            return
        per_token = step.seconds / step.num_tokens
        avg = self._seconds_per_token
        self._seconds_per_token = per_token if avg is None else 0.8 * avg + 0.2 * per_token
        self.value = max(1, int(self.step_s / self._seconds_per_token))
