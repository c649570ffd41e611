"""What a compile worker sends back over its pipe, as typed objects (frozen dataclasses: they pickle).

Artifacts (the result of one job): an ``AutomatonArtifact`` (a token automaton) or an ``LLGuidanceArtifact``
(llguidance grammar text and a completion plan). Frames: ``Ready`` once after start-up, then per job any
number of ``Partial`` before one ``Done`` or ``Failed``. (The parent's frames: one ``WorkerInit``, then
(job_id, kind, payload) per job.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from loraplex.grammar.backend_outlines.automaton import AutomatonData
    from loraplex.grammar.grounding import GroundedSlot
    from loraplex.grammar.span_automaton import TemplateDFA
    from loraplex.grammar.vocab import VocabInfo
    from loraplex.grammar.workers.job import CompileOptions

# The first frame the parent sends: the tokenizer, the options, the address-space limit in bytes (0: none).
WorkerInit: TypeAlias = tuple["VocabInfo", "CompileOptions", int]


@dataclass(frozen=True)
class AutomatonArtifact:
    """A token automaton (served by the outlines backend) and the completion search's plan from its start."""

    data: AutomatonData
    plan: list[int]  # tokens from the start to a complete output (grammar/budget.py)
    states: int | None = None  # the state count when it was probed before the build
    narrowing: tuple[str, ...] = ()  # how the constraint was narrowed (the regex's cuts included)


@dataclass(frozen=True)
class LLGuidanceArtifact:
    """llguidance grammar text (the parent builds its own matcher from it) and a completion plan."""

    grammar: str
    plan: list[int]  # tokens from the start to a complete output
    states: int | None = None  # the automaton's state count when it was probed (None: not counted)
    upgrade: str | None = None  # a regex whose automaton may replace this grammar in the background
    narrowing: tuple[str, ...] = ()
    automaton_language: bool = False  # the grammar is an exact regex, served as its automaton would be


@dataclass(frozen=True)
class GroundedArtifact:
    """A schema with grounded values (grammar/grounding.py): the Lark template each request completes with its
    source text, and what finding the values' spans afterwards needs."""

    template: str
    slots: tuple[GroundedSlot, ...]
    schema: str  # the internal schema's JSON text (grounding.locate walks it)
    automaton_language: bool  # a response-format document (not tool calls): served as the automaton's language
    tags: tuple[str, str] | None = None  # tool calls: open and close tags around each call
    plan: list[int] | None = None  # a completion through empty spans (valid whatever the source), if there is one
    narrowing: tuple[str, ...] = ()
    # the schema as our span automaton serves it (grammar/span_automaton.py), where it can; None: llguidance does
    span_template: TemplateDFA | None = None


Artifact: TypeAlias = AutomatonArtifact | LLGuidanceArtifact | GroundedArtifact


@dataclass(frozen=True)
class JobResult:
    """What a job returns inside the worker: the artifact, and whether the worker must exit after replying."""

    artifact: Artifact
    recycle: bool = False  # the state-counting thread is still running: start a fresh worker


@dataclass(frozen=True)
class PrebuildHint:
    """Sent before the job ends: the worker is about to build an llguidance matcher from this text."""

    llguidance: str


@dataclass(frozen=True)
class Ready:
    """The worker's greeting: its tokenizer state is built."""


@dataclass(frozen=True)
class Partial:
    job_id: int
    body: PrebuildHint


@dataclass(frozen=True)
class Done:
    job_id: int
    artifact: Artifact
    recycle: bool  # this process exits after the reply (a stuck thread)


@dataclass(frozen=True)
class Failed:
    job_id: int
    message: str
    code: str  # the GrammarError code it becomes in the parent
    recycle: bool  # this process exits after the reply (a memory error)


Reply: TypeAlias = Partial | Done | Failed
