"""Tenants and their keys (controller, service, key hashing), their running limits and request rate limits."""
