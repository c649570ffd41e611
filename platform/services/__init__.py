"""Business logic behind the routes: tenants and keys, adapter registry and blob store, cache, rate limits."""
