"""loraplex.grammar: structured output (JSON schema, regex, choice, Lark grammar) as token masks.

Public API: StructuredSpec, GrammarError, GrammarCompiler, GrammarBackend, CompiledGrammar, GrammarMatcher. By role:

* ``spec`` (what a request asks for), ``compiler`` (compile cache and worker pools, used by the engine),
  ``vocab`` (the tokenizer as both backends see it), ``backend_types`` (the interface the engine codes against);
* ``schema/``: JSON Schema checks and translation to a regex;
* ``backend_outlines/`` (token automaton) and ``backend_llguidance/``: the two backends;
* ``workers/``: compile worker processes and the job each one runs.

Exports are resolved lazily so compile worker processes never import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loraplex.grammar.spec import GrammarError, StructuredSpec

if TYPE_CHECKING:
    from loraplex.grammar.backend_types import CompiledGrammar, GrammarBackend, GrammarMatcher
    from loraplex.grammar.compiler import GrammarCompiler

__all__ = ["CompiledGrammar", "GrammarBackend", "GrammarCompiler", "GrammarError", "GrammarMatcher", "StructuredSpec"]

_LAZY = {
    "CompiledGrammar": "loraplex.grammar.backend_types",
    "GrammarBackend": "loraplex.grammar.backend_types",
    "GrammarMatcher": "loraplex.grammar.backend_types",
    "GrammarCompiler": "loraplex.grammar.compiler",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'loraplex.grammar' has no attribute {name!r}")
