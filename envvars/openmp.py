"""OpenMP's barrier waits for the engine on a shared CPU (why: loraplex/engine/openmp.py), set on import.

A leaf (no torch): it must run before torch loads libgomp, which reads the setting once. The engine package, the
``loraplex`` command line and the benchmarks import it first.
"""

from __future__ import annotations

import os
import sys

SPINCOUNT = "1000"  # iterations a thread spins at a barrier before it sleeps (libgomp's default: 300,000)


def configure_waits(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Set GOMP_SPINCOUNT unless the user chose a wait policy; False when nothing was set (chosen, or too late:
    torch, and so libgomp, already loaded)."""
    if "GOMP_SPINCOUNT" in env or "OMP_WAIT_POLICY" in env or "torch" in sys.modules:
        return False
    env["GOMP_SPINCOUNT"] = SPINCOUNT
    return True


configure_waits()
