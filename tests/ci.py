"""Whether this test run is CI's: CI sets CI=true, and there a part that must be tested fails its tests where it
is missing, instead of skipping them (tests/c_kernels.py, the compose test's load balancer)."""

from __future__ import annotations

import os


def on_ci() -> bool:
    """True under CI (CI=true; also 1 or yes, as some CI systems write it)."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}
