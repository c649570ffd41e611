"""The engine-side state of one request."""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loraplex.engine.core.share import DEFAULT_SHARE, Share
from loraplex.engine.outputs import FinishReason
from loraplex.engine.sample.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from loraplex.engine.reasoning import Phase
    from loraplex.grammar import CompiledGrammar, GrammarMatcher
    from loraplex.grammar.backend_llguidance.grounded import Grounding


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    adapter_hash: str | None = None  # content hash of the LoRA adapter, None = base model
    cache_salt: str | None = None  # isolates prefix-cache sharing (e.g. per tenant)
    share: Share = DEFAULT_SHARE  # whose share of the engine this request draws on (fair scheduling)
    arrival: int = 0  # order of arrival (set by the scheduler; ties and fcfs order)
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    # KV state
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    # one block table per KV-cache group (engine.core.kv_groups; the block manager adds the others on first use);
    # NULL_BLOCK entries: released, out of the group's sliding window
    block_tables: list[list[int]] = field(default_factory=lambda: [[]])
    released_blocks: list[int] = field(default_factory=lambda: [0])  # per group: leading entries released
    block_hashes: list[bytes] = field(default_factory=list)  # hashes of this sequence's full blocks
    prefix_hashes: list[bytes] = field(default_factory=list)  # block manager's memo: leading blocks' hashes
    num_cached_prompt_tokens: int = 0  # prefix-cache hits at first admission
    num_preemptions: int = 0
    num_charged_tokens: int = 0  # tokens charged to the tenant's fair share (recomputation is not charged again)
    # structured output / adapter plumbing, filled by the engine
    grammar: GrammarMatcher | None = None  # once compiled
    narrowing: tuple[str, ...] | None = None  # how the constraint was narrowed (empty: exact; None: no constraint)
    grounding: Grounding | None = None  # a grounded grammar's: finds where the output's values came from
    reasoning_phase: Phase | None = None  # where a reasoning request's output starts (engine/reasoning.py)
    grammar_future: Future[CompiledGrammar] | None = None  # while compiling (requests added without precheck)
    generator: torch.Generator | None = None  # for seeded sampling
    first_token_time: float | None = None
    # fewer decode steps (engine/spec/speculative.py): draft tokens proposed for this step (not yet output; the
    # scheduler computes them after the known tokens), and per-request counts
    spec_token_ids: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0  # proposed and verified
    num_accepted_tokens: int = 0  # drafts verification kept
    num_forced_tokens: int = 0  # appended by jump-forward without sampling
    draft_state: Any = None  # engine.spec.drafts.DraftState, while drafts are proposed for it

    @property
    def block_table(self) -> list[int]:
        """The first group's block table (the only one unless the model mixes sliding and global layers)."""
        return self.block_tables[0]

    @block_table.setter
    def block_table(self, table: list[int]) -> None:
        self.block_tables[0] = table

    @property
    def num_released_blocks(self) -> int:
        """Leading entries of the first group's table a sliding window released (engine.core.block_manager)."""
        return self.released_blocks[0]

    @num_released_blocks.setter
    def num_released_blocks(self, n: int) -> None:
        self.released_blocks[0] = n

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def step_tokens(self, start: int, end: int) -> list[int]:
        """Tokens start..end of the known tokens followed by this step's drafts."""
        known = self.num_tokens
        if end <= known:
            return self.tokens(start, end)
        return self.tokens(start, known) + self.spec_token_ids[: end - known]

    @property
    def remaining_tokens(self) -> int | None:
        if self.params.max_tokens is None:
            return None
        return self.params.max_tokens - len(self.output_token_ids)
