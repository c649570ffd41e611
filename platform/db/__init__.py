"""Registry database: SQLAlchemy models, engine/session setup and Alembic migrations."""
