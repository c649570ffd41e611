"""The token-automaton backend: a DFA over the vocabulary built with outlines_core's Index (``automaton``),
and its compiled grammar and per-sequence matcher (``grammar``)."""
