"""Every ``LORAPLEX_*`` environment variable loraplex reads, in one place.

Server settings and engine arguments are read generically: each ``Settings`` field and each ``EngineArgs``
field ``name`` is ``LORAPLEX_<NAME>`` (``setting``, used by ``loraplex.platform.settings``). The variables
below are the others. This module is a leaf (no torch, no loraplex imports): the kernels, the engine, the
platform, the tests and the benchmarks all read their variables through it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PREFIX = "LORAPLEX_"


@dataclass(frozen=True)
class Variable:
    name: str
    meaning: str


VARIABLES = (
    Variable(
        "LORAPLEX_CACHE_DIR",
        "root of loraplex's caches (default ~/.cache/loraplex): the converted default "
        "model under models/, the C kernels under kernels/",
    ),
    Variable("LORAPLEX_KERNEL_CACHE", "where the compiled C kernels go (default <cache dir>/kernels)"),
    Variable("LORAPLEX_CPU_KERNELS", "0 runs the torch paths instead of the C kernels on the CPU (default 1)"),
    Variable("LORAPLEX_ONEDNN", "0 runs the CPU projections on F.linear instead of oneDNN's packed linear (default 1)"),
    Variable(
        "LORAPLEX_DECODE_WALK",
        "0 runs decode steps of quantized CPU models layer by layer from Python instead of in one C call "
        "(the same results; default 1)",
    ),
    Variable(
        "LORAPLEX_DATA_DIR",
        "the server's SQLite registry and adapter store (default "
        "$XDG_DATA_HOME/loraplex, else ~/.local/share/loraplex)",
    ),
    Variable(
        "LORAPLEX_<SETTING>",
        "any server setting or engine argument, e.g. LORAPLEX_PORT, "
        "LORAPLEX_REDIS_URL, LORAPLEX_MAX_NUM_SEQS (`loraplex serve --help` lists them)",
    ),
    Variable(
        "LORAPLEX_BASE_URL", "the tenant commands (`loraplex adapters ...`): the server's URL, over the login profile's"
    ),
    Variable("LORAPLEX_API_KEY", "the tenant commands: the tenant's API key, over the login profile's"),
    Variable("LORAPLEX_TEST_DEVICE", "tests only: cuda runs the kernel and engine tests on a GPU (default cpu)"),
    Variable(
        "LORAPLEX_SCHEMA_SUITE", "tests only: the JSON Schema Test Suite subset (default ../shared/schemas/suite.jsonl)"
    ),
    Variable("LORAPLEX_WORKLOAD_DIR", "benchmarks only: Workload A's folder (default ../shared/bench)"),
)


def _get(name: str, env: Mapping[str, str] | None = None) -> str | None:
    value = (os.environ if env is None else env).get(name)
    return value if value not in (None, "") else None


def _switch(name: str) -> bool:
    return (_get(name) or "1").strip().lower() not in ("0", "false", "no", "off")


def setting(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The raw ``LORAPLEX_<NAME>`` value of a server setting or engine argument (None when unset or empty)."""
    return _get(setting_variable(name), env)


def setting_variable(name: str) -> str:
    return PREFIX + name.upper()


def cache_dir() -> Path:
    """Root of loraplex's caches: $LORAPLEX_CACHE_DIR, else ~/.cache/loraplex."""
    value = _get("LORAPLEX_CACHE_DIR")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "loraplex"


def kernel_cache_dir() -> Path:
    value = _get("LORAPLEX_KERNEL_CACHE")
    return Path(value).expanduser() if value else cache_dir() / "kernels"


def cpu_kernels_enabled() -> bool:
    return _switch("LORAPLEX_CPU_KERNELS")


def onednn_enabled() -> bool:
    return _switch("LORAPLEX_ONEDNN")


def decode_walk_enabled() -> bool:
    return _switch("LORAPLEX_DECODE_WALK")


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """$LORAPLEX_DATA_DIR, else $XDG_DATA_HOME/loraplex, else ~/.local/share/loraplex."""
    env = os.environ if env is None else env
    value = _get("LORAPLEX_DATA_DIR", env)
    if value:
        return Path(value).expanduser()
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    base = env.get("XDG_DATA_HOME") or str(home / ".local" / "share")
    return Path(base).expanduser() / "loraplex"


def client_base_url() -> str | None:
    return _get("LORAPLEX_BASE_URL")


def client_api_key() -> str | None:
    return _get("LORAPLEX_API_KEY")


def device_for_tests() -> str:
    return _get("LORAPLEX_TEST_DEVICE") or "cpu"


def schema_suite() -> Path | None:
    value = _get("LORAPLEX_SCHEMA_SUITE")
    return Path(value) if value else None


def workload_dir() -> Path | None:
    value = _get("LORAPLEX_WORKLOAD_DIR")
    return Path(value) if value else None
