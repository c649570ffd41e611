"""Adapters imported by reference (s3://, https://, hf://): sources, the address policy every connection passes,
tenants' encrypted source credentials, and the background jobs that fetch, check and publish them."""
