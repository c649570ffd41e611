"""loraplex.grammar: structured output (JSON schema, regex, choice, Lark grammar) as token masks.

Public API: StructuredSpec, GrammarError, GrammarCompiler, CompiledGrammar, GrammarMatcher.
Exports are resolved lazily so compile worker processes never import torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loraplex.grammar.spec import GrammarError, StructuredSpec

if TYPE_CHECKING:
    from loraplex.grammar.base import CompiledGrammar, GrammarMatcher
    from loraplex.grammar.compiler import GrammarCompiler

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "GrammarMatcher", "StructuredSpec"]

_LAZY = {"CompiledGrammar": "loraplex.grammar.base", "GrammarMatcher": "loraplex.grammar.base",
         "GrammarCompiler": "loraplex.grammar.compiler"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'loraplex.grammar' has no attribute {name!r}")
