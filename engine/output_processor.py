"""Turns the tokens a step took into what the caller sees (vLLM v1's OutputProcessor): one state per live
request (its incremental detokenizer, logprobs, what was already sent), stop checks, and ``RequestOutput``s.

Rules:

* A token is checked against the stop conditions in this order: the grammar (it may finish the request, or
  fail it when the matcher rejects a token its own mask allowed), EOS (unless ``ignore_eos``) and stop token
  ids, stop strings (the detokenizer cuts the text before them), ``max_tokens``, then ``max_model_len``.
* An output carries what is new since the previous one (tokens, logprobs, text); text that could begin a stop
  string is held back until the request finishes or the string is ruled out.
* Logprobs of sampled tokens are the sampler's (after processing); prompt logprobs are the raw model
  distribution's, with ranks. A prompt recomputed after preemption writes the same positions again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from loraplex.engine.core.sequence import Sequence
from loraplex.engine.detokenizer import IncrementalDetokenizer
from loraplex.engine.field_logprobs import FieldLogprob, field_logprobs
from loraplex.engine.outputs import FinishReason, RequestOutput, TokenLogprob
from loraplex.engine.reasoning import ReasoningSplitter
from loraplex.engine.sample.sampler import SampleResult
from loraplex.engine.structured import StructuredOutputManager


@dataclass
class RequestState:
    """A live request's output side: its sequence, text so far, logprobs, and what the last output sent."""

    seq: Sequence
    detok: IncrementalDetokenizer
    logprobs: list[TokenLogprob] | None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    sent_tokens: int = 0
    sent_logprobs: int = 0
    error: str | None = None
    splitter: ReasoningSplitter | None = None  # a reasoning request's: reasoning and content apart


class OutputProcessor:
    def __init__(
        self, tokenizer: Any, eos_token_ids: set[int], max_model_len: int, structured: StructuredOutputManager
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.structured = structured
        self.requests: dict[str, RequestState] = {}

    def add(self, seq: Sequence) -> RequestState:
        p = seq.params
        state = RequestState(
            seq,
            IncrementalDetokenizer(self.tokenizer, p.stop, p.skip_special_tokens),
            [] if p.wants_token_logprobs else None,
            [None] * seq.num_prompt_tokens if p.prompt_logprobs is not None else None,
        )
        if seq.reasoning_phase is not None and self.structured.reasoning is not None:
            state.splitter = ReasoningSplitter(self.structured.reasoning, seq.reasoning_phase)
        self.requests[seq.request_id] = state
        return state

    def text(self, request_id: str) -> str:
        """The request's text so far (drafts look it up)."""
        return self.requests[request_id].detok.text

    def token_str(self, token: int) -> str:
        text: str = self.tokenizer.convert_ids_to_tokens(token)  # one id in: one token string out
        return text

    def record_logprobs(self, seq: Sequence, token: int, result: SampleResult, row: int) -> None:
        """The sampled token's logprob and the top ones (``result``'s ``row``), if the request asks for them."""
        req = self.requests[seq.request_id]
        if req.logprobs is not None:
            top = [(t, self.token_str(t), lp) for t, lp in (result.top[row] if result.top else [])]
            assert result.logprobs is not None  # a request asking for logprobs makes the sampler compute them
            req.logprobs.append(TokenLogprob(token, self.token_str(token), result.logprobs[row], top))

    def record_prompt_logprobs(self, seq: Sequence, first: int, logits: torch.Tensor) -> None:
        """Logprobs (raw model distribution), ranks and top ones of prompt tokens first.. from their logits rows;
        a recomputation after preemption writes the same positions again."""
        req = self.requests[seq.request_id]
        if req.prompt_logprobs is None:
            return
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(seq.prompt_token_ids[first : first + logits.shape[0]], device=logits.device)
        chosen = logprobs.gather(1, targets.view(-1, 1))
        ranks = (logprobs > chosen).sum(dim=-1) + 1
        k = seq.params.prompt_logprobs or 0
        top_vals, top_idx = logprobs.topk(k, dim=-1) if k else (None, None)
        chosen_l, ranks_l, targets_l = chosen.view(-1).tolist(), ranks.tolist(), targets.tolist()
        tops_v = top_vals.tolist() if top_vals is not None else [[]] * len(targets_l)
        tops_i = top_idx.tolist() if top_idx is not None else [[]] * len(targets_l)
        for j, token in enumerate(targets_l):
            top = [(t, self.token_str(t), v) for t, v in zip(tops_i[j], tops_v[j])]
            req.prompt_logprobs[first + j] = TokenLogprob(token, self.token_str(token), chosen_l[j], top, ranks_l[j])

    def _field_logprobs(self, req: RequestState) -> dict[str, FieldLogprob] | None:
        """Per leaf of the finished JSON output, its tokens' logprobs; None when not asked for, or when the output is
        not one JSON value (cut short by an abort or an error)."""
        seq = req.seq
        if not seq.params.field_logprobs or req.logprobs is None:
            return None
        token_bytes = self.structured.compiler.vocab.token_bytes
        answer = seq.grammar.answer_start if seq.grammar is not None else 0  # (after any reasoning)
        tokens = [(token_bytes[lp.token_id] or b"", lp.logprob) for lp in req.logprobs[answer:]]
        try:
            return field_logprobs([t for t, _ in tokens], [lp for _, lp in tokens])
        except ValueError:
            return None

    def check_stop(self, seq: Sequence, token: int) -> FinishReason | None:
        """Detokenize and advance the grammar by the token just appended; the reason it finishes the request."""
        req = self.requests[seq.request_id]
        p = seq.params
        req.detok.add(token)
        grammar_reason = self.structured.advance(seq, token)
        if grammar_reason == "error":
            req.error = "the structured-output matcher rejected a token its own mask allowed"
        if grammar_reason:
            return grammar_reason
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if req.detok.stopped:
            return "stop"
        if p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens:
            return "length"
        if seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def output(self, req: RequestState, reason: FinishReason | None) -> RequestOutput:
        """What is new since the last output (all of the text once ``reason`` finishes the request)."""
        seq = req.seq
        new_tokens = seq.output_token_ids[req.sent_tokens :]
        req.sent_tokens = len(seq.output_token_ids)
        new_lp = None
        if req.logprobs is not None:
            new_lp = req.logprobs[req.sent_logprobs :]
            req.sent_logprobs = len(req.logprobs)
        text = req.detok.text if reason else req.detok.text[: req.detok.emitted]
        new_text = req.detok.release(final=reason is not None)
        reasoning, new_reasoning = None, ""
        if req.splitter is not None:  # text and new_text: the content only
            new_reasoning, new_text = req.splitter.feed(new_text, final=reason is not None)
            text = req.splitter.content
            reasoning = req.splitter.reasoning if req.splitter.reasoned else None
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            text=text,
            token_ids=list(seq.output_token_ids),
            new_text=new_text,
            reasoning=reasoning,
            new_reasoning=new_reasoning,
            new_token_ids=new_tokens,
            finish_reason=reason,
            logprobs=req.logprobs,
            new_logprobs=new_lp,
            num_cached_tokens=seq.num_cached_prompt_tokens,
            error=req.error,
            narrowing=seq.narrowing,
            prompt_logprobs=req.prompt_logprobs,
            field_logprobs=self._field_logprobs(req) if reason else None,
            grounded_values=seq.grounding.locate(text) if reason and seq.grounding is not None else None,
            num_draft_tokens=seq.num_draft_tokens,
            num_accepted_tokens=seq.num_accepted_tokens,
            num_forced_tokens=seq.num_forced_tokens,
        )
