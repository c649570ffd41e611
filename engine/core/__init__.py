"""The engine's core: which sequences run each step (scheduler, request queue and its policies), the paged KV
cache's blocks (block manager, prefix cache, KV groups for sliding-window layers) and the sequences themselves."""
