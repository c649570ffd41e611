"""HTTP route handlers (Litestar controllers)."""
