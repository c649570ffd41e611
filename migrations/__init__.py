"""Alembic environment and versions of the loraplex registry (installed as `loraplex.migrations`)."""
