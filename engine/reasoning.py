"""Reasoning before the answer: vLLM's reasoning parsers for models that think in ``<think>...</think>``.

``qwen3`` (Qwen3: the model opens the block itself; ``enable_thinking=False`` makes the chat template write an
empty block into the prompt) and ``deepseek_r1`` (R1 distills: the template opens the block in the prompt, the model
closes it) share one reading, taken from the prompt's tail: a prompt that ends inside an open block starts the output
in reasoning; one whose last block is closed at its very end (thinking switched off) starts in the answer; otherwise
the output may open a block first. The text between the markers is the message's ``reasoning`` (vLLM's current
name), the text after the closing marker (leading whitespace dropped) its ``content``.

A constrained request's constraint applies to the answer only, and one ``max_tokens`` covers both: the matcher
(grammar/reasoning.py) forces the closing marker early enough that the shortest valid answer still fits.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_args

ReasoningParserName: TypeAlias = Literal["qwen3", "deepseek_r1"]
REASONING_PARSERS: tuple[ReasoningParserName, ...] = get_args(ReasoningParserName)


class Phase(enum.Enum):
    MAY_OPEN = "may_open"  # the output may start with the opening marker; anything else starts the answer
    REASONING = "reasoning"
    ANSWER = "answer"


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers of one parser, and their token ids under the served tokenizer."""

    name: ReasoningParserName
    start: str
    end: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]

    @classmethod
    def of(cls, name: str, tokenizer: Any) -> ReasoningFormat:
        if name not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, got {name!r}")
        start, end = "<think>", "</think>"
        ids = [tuple(tokenizer.encode(m, add_special_tokens=False)) for m in (start, end)]
        return cls(name, start, end, ids[0], ids[1])

    def initial_phase(self, prompt_text: str) -> Phase:
        """Where the output starts, read from the prompt (the chat template's output)."""
        tail = prompt_text.rstrip()
        if tail.endswith(self.end):
            return Phase.ANSWER  # an empty block written by the template: thinking is off
        if prompt_text.rfind(self.start) > prompt_text.rfind(self.end):
            return Phase.REASONING
        return Phase.MAY_OPEN


class ReasoningSplitter:
    """Splits a streamed output into reasoning and content; a marker cut across two deltas is held back until it
    is whole (so neither stream ever shows part of one)."""

    def __init__(self, fmt: ReasoningFormat, phase: Phase) -> None:
        self._fmt = fmt
        self._phase = phase
        self._pending = ""  # text not yet assigned (it may be the start of a marker)
        self._content_started = False
        self.reasoning = ""
        self.content = ""
        self.reasoned = phase == Phase.REASONING  # whether the output has a reasoning part at all

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """The (reasoning, content) deltas of ``text``; ``final``: nothing more will come."""
        self._pending += text
        reasoning, content = [], []
        while self._pending:
            if self._phase == Phase.MAY_OPEN:
                start = self._fmt.start
                stripped = self._pending.lstrip()
                if stripped.startswith(start):
                    self._pending = stripped[len(start) :]
                    self._phase = Phase.REASONING
                    self.reasoned = True
                    continue
                if start.startswith(stripped) and not final:
                    break  # maybe the opening marker, cut
                self._phase = Phase.ANSWER
                continue
            if self._phase == Phase.REASONING:
                end = self._fmt.end
                at = self._pending.find(end)
                if at >= 0:
                    reasoning.append(self._pending[:at])
                    self._pending = self._pending[at + len(end) :]
                    self._phase = Phase.ANSWER
                    continue
                keep = 0 if final else _partial_suffix(self._pending, end)
                reasoning.append(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                break
            piece = self._pending
            if not self._content_started and self.reasoned:
                piece = piece.lstrip()
                if not piece and not final:
                    self._pending = ""
                    break
            self._content_started = self._content_started or bool(piece)
            content.append(piece)
            self._pending = ""
        r, c = "".join(reasoning), "".join(content)
        self.reasoning += r
        self.content += c
        return r, c


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
