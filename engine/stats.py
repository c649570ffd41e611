"""Engine statistics: one frozen snapshot per manager, composed into ``EngineStats`` (what ``LLMEngine.stats``
and ``AsyncEngine.stats`` return, and what platform.metrics exports). Counters are cumulative since the engine
started; the rest is the state at the snapshot. Adapter lists hold content hashes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVCacheStats:
    """The block manager's pool and prefix cache."""

    blocks_total: int = 0
    blocks_used: int = 0
    usage: float = 0.0  # blocks_used / blocks_total
    prefix_cache_hit_rate: float = 0.0  # prompt tokens served from the prefix cache / prompt tokens looked up
    prefix_cache_queries: int = 0  # prompt tokens looked up (counter)
    prefix_cache_hits: int = 0  # prompt tokens served from the cache (counter)


@dataclass(frozen=True)
class LoRAStats:
    """The adapter manager's slots and tiers (vLLM's lora_requests_info reads the first three)."""

    max_loras: int = 0
    running_adapters: list[str] = field(default_factory=list)  # sorted
    waiting_adapters: list[str] = field(default_factory=list)  # in queue order
    max_cpu_loras: int = 0
    loads: int = 0  # into a device slot (counter)
    evictions: int = 0  # from a device slot (counter)
    disk_loads: int = 0  # read from the store into host memory (counter)
    cpu_evictions: int = 0  # dropped from host memory (counter)
    load_failures: int = 0  # (counter)
    resident_adapters: list[str] = field(default_factory=list)  # in device slots
    cpu_adapters: int = 0  # held in host memory
    host_adapters: list[str] = field(default_factory=list)
    pinned_adapters: list[str] = field(default_factory=list)  # sorted; never evicted from host memory


@dataclass(frozen=True)
class GrammarStats:
    """Structured output's grammar compiles (zeros until the first constrained request starts the compiler)."""

    compiles: int = 0  # cache misses (counter)
    compile_seconds: float = 0.0  # (counter)
    cache_hits: int = 0  # (counter)


@dataclass(frozen=True)
class SpecDecodeStats:
    """Fewer decode steps: n-gram drafts verified (vLLM's spec-decode counters) and jump-forward's tokens."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_forced_tokens: int = 0  # tokens a grammar forced, taken without sampling


@dataclass(frozen=True)
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0  # sequences preempted for lack of KV blocks (counter)
    kv_cache: KVCacheStats = field(default_factory=KVCacheStats)
    lora: LoRAStats = field(default_factory=LoRAStats)
    grammar: GrammarStats = field(default_factory=GrammarStats)
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)
