"""What the server's async front sends the engine core (on the engine thread): one dataclass per command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from loraplex.engine.core.share import DEFAULT_SHARE, Share
from loraplex.engine.lora.manager import CheckedAdapter
from loraplex.engine.lora.ref import AdapterRef
from loraplex.engine.sample.sampling_params import SamplingParams

if TYPE_CHECKING:
    from loraplex.grammar import CompiledGrammar


@dataclass(frozen=True)
class AddRequest:
    """Queue a request that ``LLMEngine.precheck`` accepted; ``grammar`` is the compiled constraint it
    returned (None for an unconstrained request), so the engine neither compiles nor checks it again."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    adapter: AdapterRef | None = None
    cache_salt: str | None = None
    grammar: CompiledGrammar | None = None
    share: Share = DEFAULT_SHARE


@dataclass(frozen=True)
class Abort:
    """Finish a request now (client gone); its KV blocks are freed."""

    request_id: str


@dataclass(frozen=True)
class AddAdapter:
    """Keep an adapter that was read and checked off the engine thread in host memory, if a host slot is free."""

    adapter: CheckedAdapter


@dataclass(frozen=True)
class RemoveAdapter:
    """Drop an adapter's host and device copies (a running sequence keeps its slot until it finishes)."""

    content_hash: str


@dataclass(frozen=True)
class PinAdapters:
    """Replace the set of adapters the host tier never evicts (content hashes)."""

    content_hashes: tuple[str, ...]


EngineMessage = AddRequest | Abort | AddAdapter | RemoveAdapter | PinAdapters
