"""The step's speculative side (rules in engine.spec.speculative): proposing drafts for the scheduler,
verifying them position by position, and settling what was accepted.

Rules:

* Drafts are proposed only while at most ``disable_by_batch_size`` sequences run, and fit the step's remaining
  token budget, ``max_model_len`` and ``max_tokens`` (the drafts and the token after them).
* Verification samples a sequence's next row only while the token just taken equals its draft there, each with
  the state plain decoding would have at that position.
* Settlement: the accepted drafts' K/V stays, the rejected ones' blocks go back; the tenant is charged for
  accepted drafts only, and only blocks of accepted tokens are hashed for the prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from loraplex.engine.core.block_manager import BlockManager
from loraplex.engine.core.sequence import Sequence
from loraplex.engine.spec.drafts import Drafter
from loraplex.engine.spec.speculative import SpeculativeConfig
from loraplex.engine.stats import SpecDecodeStats


@dataclass
class SpecCounters:
    """Cumulative counters (vLLM's spec-decode metrics, and jump-forward's forced tokens)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_forced_tokens: int = 0

    def snapshot(self) -> SpecDecodeStats:
        return SpecDecodeStats(**vars(self))


class DraftProposer:
    """The scheduler's proposer: (running sequence, tokens left in the step's budget) -> drafts to verify."""

    def __init__(
        self,
        cfg: SpeculativeConfig,
        drafter: Drafter,
        max_model_len: int,
        num_running: Callable[[], int],
        output_text: Callable[[str], str],
    ) -> None:
        self.cfg = cfg
        self.drafter = drafter
        self.max_model_len = max_model_len
        self.num_running = num_running
        self.output_text = output_text

    def __call__(self, seq: Sequence, budget: int) -> list[int]:
        cfg = self.cfg
        if self.num_running() > cfg.disable_by_batch_size:
            return []
        k = min(cfg.num_speculative_tokens, budget, self.max_model_len - seq.num_tokens)
        if seq.remaining_tokens is not None:
            k = min(k, seq.remaining_tokens - 1)  # the drafts and the token after them fit max_tokens
        if k <= 0:
            return []
        return self.drafter.propose(seq, self.output_text(seq.request_id), k)


def verify(
    seqs: list[Sequence],
    counts: list[int],
    logits: torch.Tensor,
    sample: Callable[[list[Sequence], torch.Tensor], None],
    failed: Callable[[Sequence], bool],
    finished: Callable[[Sequence], bool],
) -> list[int]:
    """Sample each sequence's rows (``counts[j]`` consecutive rows of ``logits``: its last known position, then
    one per draft) position by position; the tokens taken per sequence. ``sample`` takes one token per row it
    is given; a sequence it ``failed`` took nothing, one it ``finished`` takes no more."""
    starts = [0] * len(seqs)
    for j in range(1, len(seqs)):
        starts[j] = starts[j - 1] + counts[j - 1]
    taken = [0] * len(seqs)
    alive, depth = list(range(len(seqs))), 0
    while alive:
        rows = [starts[j] + depth for j in alive]
        sample([seqs[j] for j in alive], logits[rows] if len(rows) != logits.shape[0] else logits)
        nxt = []
        for j in alive:
            seq = seqs[j]
            if failed(seq):
                continue  # e.g. non-finite logits: nothing taken
            taken[j] += 1
            if finished(seq):
                continue  # this token finished it
            drafts = seq.spec_token_ids
            if depth < len(drafts) and seq.output_token_ids[-1] == drafts[depth]:
                nxt.append(j)
        alive, depth = nxt, depth + 1
    return taken


class DraftSettler:
    def __init__(
        self, block_manager: BlockManager, charge: Callable[[Sequence, int], None], counters: SpecCounters
    ) -> None:
        self.block_manager = block_manager
        self.charge = charge  # the tenant's fair-share account (the scheduler's queue)
        self.counters = counters

    def settle(self, seq: Sequence, accepted: int, failed: bool) -> None:
        """After verification: keep the accepted drafts, release the rejected ones (module rules)."""
        drafts = len(seq.spec_token_ids)
        seq.spec_token_ids = []
        seq.num_draft_tokens += drafts
        seq.num_accepted_tokens += accepted
        self.counters.num_drafts += 1
        self.counters.num_draft_tokens += drafts
        self.counters.num_accepted_tokens += accepted
        if failed:
            return  # its blocks were freed with it
        self.charge(seq, accepted)
        seq.num_computed_tokens += accepted
        self.block_manager.truncate(seq)
        self.block_manager.register_full_blocks(seq)
