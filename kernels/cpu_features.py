"""What this CPU does natively, read once from ``/proc/cpuinfo``: the one place that decides whether bfloat16
is a serving dtype on the CPU.

bfloat16 pays on the CPU only where the matrix units take it natively: ``avx512_bf16`` (bf16 dot products
in the AVX-512 units) or ``amx_bf16`` (Intel AMX tiles) on x86, ``bf16`` (the BFDOT/BFMMLA instructions) on
Arm. Elsewhere oneDNN and torch emulate it through float32 conversions (not measured here: the project's
machines have it), so the engine refuses it there (``require_native_bf16``) rather than serve an emulation.
torch has no public helper for this (``torch.backends.mkldnn`` reports bf16 support on any AVX-512 core,
emulated or not).
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["NATIVE_BF16_FLAGS", "cpu_flags", "native_bf16_feature", "require_native_bf16"]

# the cpuinfo flags that mean native bfloat16 arithmetic (x86 first, then Arm's Features)
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")

CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The first processor's feature flags (x86 ``flags``, Arm ``Features``); empty where unreadable."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16_feature(flags: frozenset[str] | None = None) -> str | None:
    """The flag that gives this CPU native bfloat16 (``amx_bf16``, ``avx512_bf16`` or Arm's ``bf16``), None
    without one."""
    have = cpu_flags() if flags is None else flags
    return next((f for f in NATIVE_BF16_FLAGS if f in have), None)


def require_native_bf16(flags: frozenset[str] | None = None) -> str:
    """The native-bfloat16 flag, or a ValueError that names the missing CPU feature."""
    found = native_bf16_feature(flags)
    if found is None:
        raise ValueError(
            "dtype bfloat16 on the CPU needs native bfloat16 arithmetic (CPU feature avx512_bf16 or amx_bf16 "
            "on x86, bf16 on Arm), which this CPU lacks (not in /proc/cpuinfo's flags): without it bfloat16 is "
            "only emulated; serve with dtype float32 (the CPU default)"
        )
    return found
