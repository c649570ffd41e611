"""Endpoints: a stable name in front of adapter versions, with defaults, canary splits, shadows and pins."""
