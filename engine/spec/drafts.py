"""Where draft tokens come from (engine.spec.speculative verifies them, so none of this can change an output).

In order, up to ``num_speculative_tokens``:

1. **Grammar drafts** (constrained requests, ``grammar_drafts``): the text the grammar forces next (a key with its
   quotes and colon), as tokens. The model's own tokenization of such text is often not the tokenizer's (SmolLM2
   writes ``":`` then ``"`` where the tokenizer merges ``":"``), and one wrong draft token costs a step; so what
   a request wrote for a forced text is kept per tenant and adapter: the whole text's tokens (drafted when the
   same text is forced again, e.g. the same schema's next request), and each tokenizer token the model wrote
   as other tokens (``":"`` -> ``":``, ``"``: applied to every forced text from then on).
2. **Text lookup** (``text_lookup``): the longest suffix (2-32 characters) of the output text, the grammar draft
   included, that occurs in the prompt, and the text that followed it there, tokenized. Extraction copies
   values from the document, but not its tokens: ``"Litware`` in JSON is ``"``, ``Lit``, ``ware`` where the
   document had `` Lit``, ``ware``, so a token n-gram finds nothing until two tokens of the value are out.
3. **Token n-gram** (vLLM's ``ngram``: ``prompt_lookup_min``..``prompt_lookup_max`` tokens over prompt and
   output), when neither found anything. Not after a grammar draft: the forced text is the schema's, and what
   followed it earlier in the output is another field's value.

A constrained request's draft is then cut at the first token its grammar refuses.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loraplex.engine.core.sequence import Sequence
from loraplex.engine.spec.speculative import SpeculativeConfig, ngram_propose

if TYPE_CHECKING:
    from loraplex.engine.structured import StructuredOutputManager

TEXT_LOOKUP_MIN_CHARS = 2
TEXT_LOOKUP_MAX_CHARS = 32
TEXT_LOOKUP_CONTINUATION = 96  # characters of the matched continuation tokenized for the draft
LEARNED_TOKENIZATIONS = 4096  # forced texts whose written tokens are kept (all tenants together)


@dataclass
class DraftState:
    """Per request: its prompt as text (decoded once) and the forced text it is writing, to learn from."""

    prompt_text: str
    # (output position, forced bytes, (tenant, adapter hash), the tokenizer's tokens of the forced text)
    forced: tuple[int, bytes, tuple[Any, ...], list[int]] | None = None


class Drafter:
    def __init__(self, cfg: SpeculativeConfig, tokenizer: Any, structured: StructuredOutputManager) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.structured = structured
        self._learned: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()

    def propose(self, seq: Sequence, output_text: str, k: int) -> list[int]:
        """Up to ``k`` draft tokens for ``seq``, whose output so far decodes to ``output_text``."""
        state = seq.draft_state
        if state is None:
            state = seq.draft_state = DraftState(self.tokenizer.decode(seq.prompt_token_ids))
        drafts: list[int] = []
        if self.cfg.grammar_drafts and seq.grammar is not None:
            drafts = self._grammar_drafts(seq, state, k)
        if len(drafts) < k:
            found: list[int] = []
            if self.cfg.text_lookup:
                text = output_text + (self.tokenizer.decode(drafts) if drafts else "")
                found = self._text_drafts(state.prompt_text, text, k - len(drafts))
            if not found and not drafts:
                context = seq.prompt_token_ids + seq.output_token_ids
                found = ngram_propose(context, self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max, k)
            drafts += found
        if drafts and seq.grammar is not None:
            drafts = drafts[: seq.grammar.valid_prefix(drafts)]  # cut at the first token the grammar refuses
        return drafts

    def _grammar_drafts(self, seq: Sequence, state: DraftState, k: int) -> list[int]:
        text, _ = self.structured.forced_text(seq)
        if not text:
            return []
        data = text.encode("utf-8")
        owner = (seq.share.tenant, seq.adapter_hash)
        learned = self._learned.get((*owner, data))
        if learned is not None:
            self._learned.move_to_end((*owner, data))
            return learned[:k]
        canonical = self.tokenizer.encode(text, add_special_tokens=False)
        state.forced = (seq.num_output_tokens, data, owner, canonical)
        drafts: list[int] = []
        for token in canonical:
            drafts += self._learned.get((*owner, token), (token,))
            if len(drafts) >= k:
                break
        return drafts[:k]

    def _text_drafts(self, prompt: str, output: str, k: int) -> list[int]:
        """Tokens of what followed, in ``prompt``, the first occurrence of the longest suffix of ``output``."""
        for n in range(min(TEXT_LOOKUP_MAX_CHARS, len(output)), TEXT_LOOKUP_MIN_CHARS - 1, -1):
            suffix = output[len(output) - n :]
            at = prompt.find(suffix)
            if at >= 0:
                cont = prompt[at + n : at + n + TEXT_LOOKUP_CONTINUATION]
                return self.tokenizer.encode(cont, add_special_tokens=False)[:k] if cont else []
        return []

    def observe(self, seq: Sequence) -> None:
        """After a step: once the request has written past a forced text it was drafted, keep (for its tenant and
        adapter) the tokens it wrote inside that text, and each tokenizer token of the text it wrote otherwise."""
        state = seq.draft_state
        if state is None or state.forced is None:
            return
        start, target, owner, canonical = state.forced
        token_bytes = self.structured.compiler.vocab.token_bytes
        got = b""
        written: list[int] = []
        starts: dict[int, int] = {}  # byte offset in the forced text -> index of the written token starting there
        for token in seq.output_token_ids[start:]:
            data = token_bytes[token] if token < len(token_bytes) else None
            if not data or not target.startswith(got + data):
                break  # this token crosses the forced text's end (or is special): the text is written
            starts[len(got)] = len(written)
            got += data
            written.append(token)
            if len(got) == len(target):
                break
        else:
            if len(got) < len(target):
                return  # not all written yet
        state.forced = None
        if not written:
            return
        self._learn((*owner, target), written)
        starts[len(got)] = len(written)
        offset = 0
        for token in canonical:  # a tokenizer token whose bytes the model wrote as other whole tokens
            end = offset + len(token_bytes[token] or b"")
            if offset in starts and end in starts and written[starts[offset] : starts[end]] != [token]:
                self._learn((*owner, token), written[starts[offset] : starts[end]])
            offset = end

    def _learn(self, key: tuple[Any, ...], tokens: list[int]) -> None:
        self._learned[key] = tokens
        self._learned.move_to_end(key)
        while len(self._learned) > LEARNED_TOKENIZATIONS:
            self._learned.popitem(last=False)
