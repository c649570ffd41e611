"""Alembic revisions of the registry schema."""
