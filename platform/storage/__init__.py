"""Where the platform keeps bytes and cached records: blob stores (filesystem, S3), the registry cache and its
Redis link (invalidation, heartbeats)."""
