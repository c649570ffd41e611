"""Prometheus metrics: request-level histograms and counters recorded by the HTTP layer, plus a
collector that reads the engine's live state (queues, KV cache, LoRA slots) at scrape time.

Each app gets its own CollectorRegistry, so several apps can live in one process (tests)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, GCCollector, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from loraplex.engine.stats import EngineStats

# (tenant, endpoint, version, role), or (endpoint id, content hash, role) without tenant labels; role: "primary"
# (the version that answered the caller) or "shadow" (a copy of the call whose answer nobody sees)
EndpointLabels = tuple[str, ...]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)


class Metrics:
    def __init__(
        self,
        stats: Callable[[], EngineStats],
        adapter_names: Callable[[list[str]], list[str]],
        *,
        block_size: int,
        tenant_labels: bool = True,
    ) -> None:
        self.tenant_labels = tenant_labels  # False: no tenant or adapter name appears in any metric
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "loraplex_time_to_first_token_seconds",
            "Time from request arrival to the first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "loraplex_inter_token_latency_seconds",
            "Time between consecutive output chunks of one request, per token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "loraplex_e2e_request_latency_seconds",
            "Request latency from arrival to the last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("loraplex_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("loraplex_generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter(
            "loraplex_requests",
            "Finished generation requests by model (base or adapter) and finish reason (abort: the client left)",
            ["tenant", "model", "finish_reason"] if tenant_labels else ["finish_reason"],
            registry=r,
        )
        # Per endpoint version (the adapter version that answered an endpoint call), so a canary can be judged.
        # Without tenant labels the endpoint is its id and the version its adapter's content hash. `role`: primary
        # (answered the caller) or shadow (a copy of the call to the endpoint's shadow version, answer discarded).
        version_labels = ["tenant", "endpoint", "version", "role"] if tenant_labels else ["endpoint", "version", "role"]
        self.endpoint_requests = Counter(
            "loraplex_endpoint_requests",
            "Endpoint calls by the version that answered and outcome (a finish reason, abort, or error: refused "
            "or failed before generating)",
            [*version_labels, "outcome"],
            registry=r,
        )
        self.endpoint_tokens = Counter(
            "loraplex_endpoint_tokens",
            "Prompt and generated tokens of endpoint calls by the version that answered",
            [*version_labels, "kind"],
            registry=r,
        )
        self.endpoint_latency = Histogram(
            "loraplex_endpoint_request_latency_seconds",
            "Endpoint call latency from arrival to the last token, by the version that answered",
            version_labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.endpoint_constrained = Counter(
            "loraplex_endpoint_constrained_requests",
            "Constrained endpoint calls by whether the schema was enforced exactly or narrowed (the narrowed "
            "share is narrowed / (exact + narrowed))",
            [*version_labels, "schema"],
            registry=r,
        )
        r.register(EngineCollector(stats, adapter_names if tenant_labels else _opaque, block_size))
        ProcessCollector(registry=r)  # CPU, memory, open files of the server process
        GCCollector(registry=r)

    def count_request(self, tenant: str, model: str, finish_reason: str) -> None:
        labels = (tenant, model, finish_reason) if self.tenant_labels else (finish_reason,)
        self.requests.labels(*labels).inc()

    def endpoint_labels(
        self, tenant: str, endpoint: str, endpoint_id: str, version: str, content: str, role: str = "primary"
    ) -> EndpointLabels:
        """The label values of one endpoint version (`version`: `name@N` or base; `content`: its content hash)."""
        return (tenant, endpoint, version, role) if self.tenant_labels else (endpoint_id, content, role)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _opaque(content_hashes: list[str]) -> list[str]:
    """Adapters by content hash instead of name (when tenant labels are off)."""
    return list(content_hashes)


class EngineCollector(Collector):
    """Reads `engine.stats()` on every scrape (no background polling)."""

    def __init__(
        self, stats: Callable[[], EngineStats], adapter_names: Callable[[list[str]], list[str]], block_size: int
    ) -> None:
        self.stats = stats
        self.adapter_names = adapter_names
        self.block_size = block_size

    def describe(self) -> list[Metric]:
        return []  # collected lazily; describing would call the engine at registration

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        kv, lora = s.kv_cache, s.lora
        usage = kv.blocks_used / max(1, kv.blocks_total)
        gauges = {
            "loraplex_num_requests_running": ("Requests in the running batch", s.num_running),
            "loraplex_num_requests_waiting": ("Requests waiting to be scheduled", s.num_waiting),
            "loraplex_kv_cache_blocks_used": ("KV-cache blocks allocated", kv.blocks_used),
            "loraplex_kv_cache_blocks_total": ("KV-cache blocks in the pool", kv.blocks_total),
            "loraplex_kv_cache_usage_ratio": ("Fraction of KV-cache blocks in use", usage),
            "loraplex_lora_host_adapters": ("Adapters held in host memory", lora.cpu_adapters),
            "loraplex_lora_pinned_adapters": (
                "Adapters a pinned endpoint keeps in host memory (never evicted)",
                len(lora.pinned_adapters),
            ),
            "loraplex_prefix_cache_hit_rate": (
                "Prompt tokens served from the prefix cache / prompt tokens",
                kv.prefix_cache_hit_rate,
            ),
            # The names the Gateway API Inference Extension's endpoint picker reads (its model-server
            # protocol, as vLLM exports them); gpu_cache_usage_perc is the older name of kv_cache_usage_perc.
            "vllm:num_requests_running": ("Requests in the running batch", s.num_running),
            "vllm:num_requests_waiting": ("Requests waiting to be scheduled", s.num_waiting),
            "vllm:kv_cache_usage_perc": ("KV-cache usage (1 = full)", usage),
            "vllm:gpu_cache_usage_perc": (
                "KV-cache usage (1 = full; the older name of vllm:kv_cache_usage_perc)",
                usage,
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=float(value))
        # Cumulative engine counters
        spec = s.spec_decode
        counters = {
            "loraplex_lora_loads": (lora.loads, "Adapters loaded into a device slot"),
            "loraplex_lora_evictions": (lora.evictions, "Adapters evicted from a device slot"),
            "loraplex_lora_disk_loads": (lora.disk_loads, "Adapters read from the store into host memory"),
            "loraplex_lora_load_failures": (lora.load_failures, "Adapter loads that failed"),
            "loraplex_num_preemptions": (s.num_preemptions, "Sequences preempted for lack of KV blocks"),
            "loraplex_prefix_cache_queries": (kv.prefix_cache_queries, "Prompt tokens looked up in the prefix cache"),
            "loraplex_prefix_cache_hits": (kv.prefix_cache_hits, "Prompt tokens served from the prefix cache"),
            "loraplex_grammar_compile_seconds": (s.grammar.compile_seconds, "Seconds spent compiling grammars"),
            "loraplex_grammar_compiles": (s.grammar.compiles, "Grammars compiled (cache misses)"),
            # vLLM's spec-decode counters (n-gram drafts verified in one pass), and jump-forward's forced tokens
            "vllm:spec_decode_num_drafts": (spec.num_drafts, "Drafts verified"),
            "vllm:spec_decode_num_draft_tokens": (spec.num_draft_tokens, "Draft tokens verified"),
            "vllm:spec_decode_num_accepted_tokens": (spec.num_accepted_tokens, "Draft tokens accepted"),
            "loraplex_spec_decode_num_forced_tokens": (
                spec.num_forced_tokens,
                "Tokens a grammar forced, taken without sampling (jump-forward)",
            ),
        }
        for name, (value, doc) in counters.items():
            yield CounterMetricFamily(name, doc, value=float(value))
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the KV cache's configuration (value 1)",
            labels=["block_size", "num_gpu_blocks"],
        )
        cache.add_metric([str(self.block_size), str(kv.blocks_total)], 1.0)
        yield cache
        # The picker takes the sample with the latest timestamp value; adapters by model id (`<tenant>/<name>`)
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on LoRA requests",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        info.add_metric(
            [
                str(lora.max_loras),
                ",".join(self.adapter_names(list(lora.running_adapters))),
                ",".join(self.adapter_names(list(lora.waiting_adapters))),
            ],
            time.time(),
        )
        yield info
