"""loraplex.grammar."""
