"""When the C-kernel tests may skip, and when they must fail instead.

They need the C kernels: a C compiler (cc, gcc or $CC) and LORAPLEX_CPU_KERNELS not set to 0. Where either is
missing, a test marked ``needs_c_kernels`` (or calling :func:`require_c_kernels`) skips with a reason naming
which, except under CI (``CI=true``, as CI sets it), where it fails naming the same: CI must test the C kernels.
LORAPLEX_CPU_KERNELS=0 is a user's deliberate switch and is honoured outside CI; under CI it fails the tests
like a missing compiler does (a CI run with the C kernels off would test none of them). With a compiler present,
a kernel that does not build or load raises KernelBuildError naming it, and its tests fail: they never skip for
that. The marker is applied by tests/conftest.py (skip before the test's fixtures are built, fail in its call).
"""

from __future__ import annotations

import pytest

from loraplex import envvars as env
from loraplex.kernels import cpu_build
from tests.ci import on_ci

needs_c_kernels = pytest.mark.needs_c_kernels  # registered and applied in tests/conftest.py


def c_kernels_missing() -> str | None:
    """Why the C kernels cannot run here; None when they can."""
    if not env.cpu_kernels_enabled():
        return "LORAPLEX_CPU_KERNELS=0 switched the C kernels off"
    if cpu_build.compiler() is None:
        return "this machine has no C compiler (cc, gcc or $CC)"
    return None


def c_kernels_expected() -> bool:
    return c_kernels_missing() is None


def require_c_kernels() -> None:
    """Return where the C kernels can run; otherwise fail the calling test under CI, and skip it elsewhere."""
    why = c_kernels_missing()
    if why is None:
        return
    if on_ci():
        pytest.fail(f"CI=true: CI must test the C kernels, but {why}", pytrace=False)
    pytest.skip(f"C kernels not tested: {why} (under CI=true this fails)")
