"""Server settings: defaults, overridden by LORAPLEX_* environment variables, overridden by CLI flags.

Engine arguments are not repeated here: every field of `EngineArgs` becomes a `--flag` and a
`LORAPLEX_<FIELD>` variable (see `engine_arg_specs`), so new engine arguments need no change here.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from loraplex.envvars import data_dir as default_data_dir
from loraplex.envvars import setting, setting_variable

MiB = 1024 * 1024
GiB = 1024 * MiB


def parse_blob_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix without slashes at either end)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc or parsed.query or parsed.fragment:
        raise ValueError(f"blob_url must look like s3://bucket/prefix, got {url!r}")
    return parsed.netloc, parsed.path.strip("/")


@dataclass
class Settings:
    """Everything `loraplex serve` needs besides the engine itself."""

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = field(default_factory=default_data_dir)
    database_url: str | None = None  # None: SQLite file <data_dir>/loraplex.db
    # s3://bucket/prefix: blobs in S3-compatible storage (endpoint and credentials from AWS_* variables), read
    # through a local cache under <data_dir>/adapters; None: blobs in <data_dir>/adapters (shared by replicas)
    blob_url: str | None = None
    database_schema: str | None = None  # PostgreSQL only: the schema to use (created if missing)
    redis_url: str | None = None  # None: in-process cache and rate limits (one replica)
    admin_key: str | None = None  # None: keys stored in the database; one is generated on first start
    # Limits
    max_upload_bytes: int = 512 * MiB
    max_request_bytes: int = 8 * MiB
    default_max_adapters: int = 100
    default_max_adapter_bytes: int = 8 * GiB
    warm_adapters: bool = True  # publishing a version or an endpoint loads it into host memory on every replica
    # The check at publish (platform/adapters/publish_check.py): every new version runs once through the engine and
    # through peft on the base (CPU, float32) before it is stored; refused (adapter_check_failed) past the tolerance
    # in log-probability, on top of 4 times the base model's own difference (measured once: the serving
    # configuration's noise, e.g. bf16 or int8 activations). A base with more parameters than the cap records
    # {"skipped": why}.
    publish_check: bool = True
    publish_check_tokens: int = 4
    publish_check_tolerance: float = 0.05
    publish_check_max_reference_params: int = 2_000_000_000
    # Adapter versions pinned endpoints may keep in the host tier, all tenants together; at most the engine's
    # max_cpu_loras - 1 (checked at startup), so a request for any other adapter still finds a host slot.
    # None: min(2, max_cpu_loras - 1)
    max_pinned_adapters: int | None = None
    shadow_max_concurrent: int = 4  # endpoint calls copied to shadow versions at once; more are dropped (counted)
    # Per-minute traffic of each endpoint version in SQL (platform/endpoints/rollups.py: the console's plots)
    endpoint_rollup_retention_days: float = 7.0  # older minutes are deleted
    endpoint_rollup_flush_s: float = 5.0  # how often a replica adds its tallies to the table
    default_adapter_versions_kept: int = 5  # versions kept per adapter name, unless a tenant sets its own
    default_rate_limit_per_minute: int = 0  # 0: unlimited unless a tenant sets its own
    # One request: its sequences (prompts * n) and requested tokens (prompt + max_tokens over its sequences)
    max_request_sequences: int = 256
    max_request_tokens: int = 524_288
    # Each tenant, unless it has its own (see platform/tenants/limits.py); 0: unlimited
    default_tenant_weight: float = 1.0  # share of the engine under --scheduling-policy fair
    default_priority: int = 0  # a tenant's priority class: its requests' default and the most urgent they may ask
    default_max_concurrent_sequences: int = 0
    default_tokens_per_minute: int = 0
    default_max_queued_requests: int = 0
    tenant_lease_ttl_s: float = 30.0  # how long a crashed replica's requests keep their slots in Redis
    max_json_depth: int = 64  # nesting of arrays/objects in JSON bodies, schemas sent as text, adapter configs
    max_concurrent_uploads: int = 4  # adapter uploads at once in this server process
    max_concurrent_uploads_per_tenant: int = 2  # ... and for one tenant in it
    cache_ttl_s: float = 60.0
    # OpenAI routes: "refuse" an unknown request field (400 naming it), or "warn": ignore it, log it and name it
    # in the x-loraplex-ignored-fields response header
    unknown_fields: str = "refuse"
    # Batch API (platform/batch/): input files, lines run at once per replica, their engine priority class
    max_batch_file_bytes: int = 200 * MiB
    max_batch_lines: int = 50_000
    batch_max_in_flight: int = 256  # lines of all batches this replica runs at once
    batch_priority: int = 1  # the least urgent class batch lines run in (background: after interactive requests)
    batch_lease_ttl_s: float = 30.0  # a dead replica's claimed lines (and finalization) free after this
    # Imports by reference (platform/adapters/imports/): addresses they may reach besides public ones (CIDRs,
    # comma separated; loopback, private, link-local and metadata addresses are refused otherwise), plain http://
    # sources, the Fernet key tenants' source credentials are encrypted with (None: a key file in data_dir, one
    # machine only), attempts and backoff on transient errors, lease, imports at once per replica, the Hub's URL
    import_allow_networks: str = ""
    import_allow_http: bool = False
    import_credentials_key: str | None = None
    import_max_attempts: int = 4
    import_retry_base_s: float = 1.0
    import_lease_ttl_s: float = 60.0
    import_max_concurrent: int = 2
    hf_endpoint: str | None = None  # None: $HF_ENDPOINT, else https://huggingface.co
    # Operations
    metrics_token: str | None = None  # set: /metrics needs 'Authorization: Bearer <metrics_token>'
    metrics_tenant_labels: bool = True  # False: no tenant or adapter name in any metric label
    log_level: str = "info"
    # Graceful drain on SIGTERM (platform/drain.py): in-flight requests get this long to finish; new ones get
    # 503 with this Retry-After. A Kubernetes pod's terminationGracePeriodSeconds must exceed the timeout.
    drain_timeout_s: float = 30.0
    drain_retry_after_s: int = 5
    # Start-up warm-up (engine/warmup.py): at most this many seconds of the step shapes, kernels, grammar
    # workers and chat template the first traffic would pay for, before the server listens (0: none)
    warmup_s: float = 15.0
    # Engine arguments (names of EngineArgs fields -> value); only the ones given are set.
    engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser()
        if self.max_upload_bytes <= 0 or self.max_request_bytes <= 0:
            raise ValueError("max_upload_bytes and max_request_bytes must be > 0")
        if self.max_request_sequences <= 0 or self.max_request_tokens <= 0:
            raise ValueError("max_request_sequences and max_request_tokens must be > 0")
        if not math.isfinite(self.default_tenant_weight) or not 0 < self.default_tenant_weight <= 1e6:
            raise ValueError(f"default_tenant_weight must be in (0, 1e6], got {self.default_tenant_weight}")
        if abs(self.default_priority) > 1 << 31:
            raise ValueError(f"default_priority must be in [-2^31, 2^31], got {self.default_priority}")
        for name in ("default_max_concurrent_sequences", "default_tokens_per_minute", "default_max_queued_requests"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: unlimited), got {getattr(self, name)}")
        if self.max_pinned_adapters is not None and self.max_pinned_adapters < 0:
            raise ValueError(f"max_pinned_adapters must be >= 0 (0: no pinning), got {self.max_pinned_adapters}")
        if self.shadow_max_concurrent < 1:
            raise ValueError(f"shadow_max_concurrent must be >= 1, got {self.shadow_max_concurrent}")
        if not 1 <= self.publish_check_tokens <= 64 or self.publish_check_max_reference_params < 1:
            raise ValueError("publish_check_tokens must be in [1, 64] and publish_check_max_reference_params >= 1")
        if not self.publish_check_tolerance > 0:
            raise ValueError(f"publish_check_tolerance must be > 0, got {self.publish_check_tolerance}")
        if not self.tenant_lease_ttl_s > 0:
            raise ValueError(f"tenant_lease_ttl_s must be > 0, got {self.tenant_lease_ttl_s}")
        for name in ("max_json_depth", "max_concurrent_uploads", "max_concurrent_uploads_per_tenant"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.unknown_fields not in ("refuse", "warn"):
            raise ValueError(f"unknown_fields must be 'refuse' or 'warn', got {self.unknown_fields!r}")
        for name in ("max_batch_file_bytes", "max_batch_lines", "batch_max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.batch_lease_ttl_s > 0 or abs(self.batch_priority) > 1 << 31:
            raise ValueError("batch_lease_ttl_s must be > 0 and batch_priority in [-2^31, 2^31]")
        if not 0 < self.endpoint_rollup_retention_days <= 3650 or not 0 < self.endpoint_rollup_flush_s <= 3600:
            raise ValueError(
                "endpoint_rollup_retention_days must be in (0, 3650] and endpoint_rollup_flush_s in (0, 3600]"
            )
        from loraplex.platform.adapters.imports.ssrf import parse_networks

        parse_networks(self.import_allow_networks)  # a ValueError naming a bad entry
        if self.import_max_attempts < 1 or self.import_max_concurrent < 1:
            raise ValueError("import_max_attempts and import_max_concurrent must be >= 1")
        if not self.import_retry_base_s >= 0 or not self.import_lease_ttl_s > 0:
            raise ValueError("import_retry_base_s must be >= 0 and import_lease_ttl_s > 0")
        if self.blob_url is not None:
            parse_blob_url(self.blob_url)  # a ValueError naming the setting
        if self.database_schema is not None and not self.database_schema.isidentifier():
            raise ValueError(f"database_schema must be a plain identifier, got {self.database_schema!r}")

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'loraplex.db'}"

    @property
    def adapter_dir(self) -> Path:
        return self.data_dir / "adapters"

    @classmethod
    def from_sources(cls, env: Mapping[str, str] = os.environ, **overrides: Any) -> Settings:
        """Defaults < LORAPLEX_* environment variables < `overrides` (values that are None are ignored)."""
        values: dict[str, Any] = {}
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "engine_args":
                continue
            raw = setting(f.name, env)
            if raw is not None:
                values[f.name] = _parse(raw, hints[f.name], setting_variable(f.name))
        engine_args = {
            spec.name: _parse(raw, spec.type, spec.env)
            for spec in engine_arg_specs()
            if (raw := setting(spec.name, env)) is not None
        }
        engine_args.update(overrides.pop("engine_args", None) or {})
        values.update({k: v for k, v in overrides.items() if v is not None})
        values.setdefault("data_dir", default_data_dir(env))
        return cls(engine_args=engine_args, **values)

    def build_engine_args(self) -> Any:
        from loraplex.engine import EngineArgs

        return EngineArgs(**self.engine_args)


@dataclass(frozen=True)
class EngineArgSpec:
    name: str
    type: Any
    default: Any

    @property
    def env(self) -> str:
        return setting_variable(self.name)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def engine_arg_specs() -> list[EngineArgSpec]:
    """One spec per EngineArgs field (flag name, env var name, type)."""
    from loraplex.engine.config import EngineArgs  # not the package: building --help need not load the engine

    hints = typing.get_type_hints(EngineArgs)
    return [EngineArgSpec(f.name, hints[f.name], f.default) for f in dataclasses.fields(EngineArgs) if f.init]


def _scalar_type(tp: Any) -> type:
    """The non-None scalar behind an annotation such as `int | None` (paths and unions of str become str)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        for preferred in (bool, int, float):
            if preferred in args:
                return preferred
        return str
    if tp in (bool, int, float):
        return tp
    return str


def _parse(raw: str, tp: Any, name: str) -> Any:
    kind = _scalar_type(tp)
    optional = type(None) in typing.get_args(tp)
    text = raw.strip()
    if optional and text.lower() in ("none", "null"):
        return None
    try:
        if kind is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true/false, got {raw!r}")
        return kind(text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def add_database_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="SQLite file and adapter store (default ~/.local/share/loraplex); env LORAPLEX_DATA_DIR",
    )
    parser.add_argument(
        "--database-url",
        help="SQLAlchemy async URL, e.g. postgresql+asyncpg://user@host/db "
        "(default: SQLite under the data dir); env LORAPLEX_DATABASE_URL",
    )
    parser.add_argument(
        "--database-schema", help="PostgreSQL schema to use (created if missing); env LORAPLEX_DATABASE_SCHEMA"
    )


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `loraplex serve`: server settings, then one flag per engine argument."""
    srv = parser.add_argument_group("server (each flag also reads LORAPLEX_<NAME>)")
    srv.add_argument("--host", help="bind address (default 127.0.0.1)")
    srv.add_argument("--port", type=int, help="port (default 8000)")
    add_database_arguments(srv)
    srv.add_argument("--redis-url", help="redis://host:6379/0: shared cache, invalidation and rate limits")
    srv.add_argument(
        "--blob-url",
        help="s3://bucket/prefix: adapter blobs in S3-compatible storage (endpoint URL and credentials from "
        "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); default: the data directory",
    )
    srv.add_argument(
        "--warm-adapters",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="load a published adapter version or endpoint into host memory on every replica (default on)",
    )
    srv.add_argument(
        "--publish-check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run every new adapter version through the engine and through peft on the base before storing it, "
        "refusing a version whose outputs differ (default on)",
    )
    srv.add_argument(
        "--publish-check-tolerance",
        type=float,
        help="log-probability difference the check at publish accepts on top of 4x the base's own (default 0.05)",
    )
    srv.add_argument(
        "--publish-check-max-reference-params",
        type=int,
        help="bases with more parameters skip the check (peft on the CPU); default 2000000000",
    )
    srv.add_argument(
        "--max-pinned-adapters",
        type=int,
        help="adapter versions pinned endpoints keep in the host tier, all tenants together; at most the "
        "engine's max_cpu_loras - 1 (default: 2, or max_cpu_loras - 1 if fewer)",
    )
    srv.add_argument(
        "--shadow-max-concurrent",
        type=int,
        help="endpoint calls copied to shadow versions at once; more are dropped and counted (default 4)",
    )
    srv.add_argument(
        "--default-adapter-versions-kept",
        type=int,
        help="versions kept per adapter name, unless a tenant sets its own (default 5)",
    )
    srv.add_argument("--admin-key", help="admin API key (default: generated once and printed)")
    srv.add_argument("--max-upload-bytes", type=int, help="largest adapter upload accepted")
    srv.add_argument("--default-rate-limit-per-minute", type=int, help="per-tenant request limit (0: none)")
    srv.add_argument("--max-json-depth", type=int, help="deepest nesting of arrays/objects in JSON input (default 64)")
    srv.add_argument("--max-concurrent-uploads", type=int, help="adapter uploads at once per server (default 4)")
    srv.add_argument(
        "--max-concurrent-uploads-per-tenant", type=int, help="adapter uploads at once per tenant (default 2)"
    )
    srv.add_argument(
        "--unknown-fields",
        choices=["refuse", "warn"],
        help="an unknown request field: refuse it (400 naming it, the default) or ignore it with a warning header",
    )
    srv.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    srv.add_argument(
        "--endpoint-rollup-retention-days",
        type=float,
        help="days of per-minute endpoint traffic kept in SQL for the console's plots (default 7)",
    )
    srv.add_argument("--endpoint-rollup-flush-s", type=float, help="seconds between writes of that traffic (default 5)")
    srv.add_argument(
        "--drain-timeout-s", type=float, help="on SIGTERM, seconds in-flight requests get to finish (default 30)"
    )
    srv.add_argument("--drain-retry-after-s", type=int, help="Retry-After of the 503s while draining (default 5)")
    srv.add_argument(
        "--warmup-s", type=float, help="at start-up, warm the engine for at most this many seconds (default 15; 0: off)"
    )
    srv.add_argument("--metrics-token", help="bearer token /metrics requires (default: none, /metrics is open)")
    srv.add_argument(
        "--metrics-tenant-labels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="label request metrics with tenant and adapter names (default on)",
    )
    lim = parser.add_argument_group("limits (each flag also reads LORAPLEX_<NAME>)")
    lim.add_argument(
        "--max-request-sequences", type=int, help="most sequences (prompts * n) in one request (default 256)"
    )
    lim.add_argument(
        "--max-request-tokens",
        type=int,
        help="most prompt + max_tokens tokens over a request's sequences (default 524288)",
    )
    lim.add_argument("--default-tenant-weight", type=float, help="a tenant's share under fair scheduling (default 1.0)")
    lim.add_argument("--default-priority", type=int, help="a tenant's priority class; lower is sooner (default 0)")
    lim.add_argument(
        "--default-max-concurrent-sequences", type=int, help="per tenant, over all replicas (default 0: unlimited)"
    )
    lim.add_argument(
        "--default-tokens-per-minute",
        type=int,
        help="per tenant: prompt + max_tokens, settled to use (default 0: unlimited)",
    )
    lim.add_argument(
        "--default-max-queued-requests",
        type=int,
        help="per tenant: generation requests not yet finished (default 0: unlimited)",
    )
    lim.add_argument(
        "--tenant-lease-ttl-s", type=float, help="seconds until a crashed replica's slots free (default 30)"
    )
    bat = parser.add_argument_group("batch API (each flag also reads LORAPLEX_<NAME>)")
    bat.add_argument("--batch-max-in-flight", type=int, help="batch lines this replica runs at once (default 256)")
    bat.add_argument("--batch-priority", type=int, help="engine priority class of batch lines (default 1)")
    bat.add_argument("--batch-lease-ttl-s", type=float, help="seconds until a dead replica's lines free (default 30)")
    imp = parser.add_argument_group("imports by reference (each flag also reads LORAPLEX_<NAME>)")
    imp.add_argument(
        "--import-allow-networks",
        help="CIDRs imports may connect to besides public addresses, comma separated (default: none)",
    )
    imp.add_argument(
        "--import-allow-http", action=argparse.BooleanOptionalAction, default=None, help="accept http:// sources"
    )
    imp.add_argument("--import-credentials-key", help="Fernet key for tenants' source credentials (all replicas)")
    imp.add_argument("--import-max-attempts", type=int, help="tries of an import on transient errors (default 4)")
    imp.add_argument("--hf-endpoint", help="the Hub's URL (default $HF_ENDPOINT, else https://huggingface.co)")
    eng = parser.add_argument_group("engine (each flag also reads LORAPLEX_<NAME>)")
    for spec in engine_arg_specs():
        kind = _scalar_type(spec.type)
        if kind is bool:
            eng.add_argument(
                spec.flag,
                dest=f"engine__{spec.name}",
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"default {spec.default}",
            )
        else:
            eng.add_argument(
                spec.flag,
                dest=f"engine__{spec.name}",
                default=None,
                metavar=spec.name.upper(),
                type=lambda raw, s=spec: _parse(raw, s.type, s.flag),
                help=f"default {spec.default}",
            )


def settings_from_args(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Settings:
    values = vars(args)
    engine = {k.removeprefix("engine__"): v for k, v in values.items() if k.startswith("engine__") and v is not None}
    server = {f.name: values.get(f.name) for f in dataclasses.fields(Settings) if f.name != "engine_args"}
    return Settings.from_sources(env, engine_args=engine, **server)
