"""When the C-kernel tests may skip: only where the machine has no C compiler, or the C kernels are switched
off (LORAPLEX_CPU_KERNELS=0). With a compiler present, a kernel that does not build or load raises
KernelBuildError naming it, and its tests fail: they never skip for that."""

from __future__ import annotations

import pytest

from loraplex import envvars as env
from loraplex.kernels import cpu_build


def c_kernels_expected() -> bool:
    return env.cpu_kernels_enabled() and cpu_build.compiler() is not None


NO_C_REASON = "this machine has no C compiler (cc, gcc or $CC), or LORAPLEX_CPU_KERNELS=0 switched the C kernels off"
needs_c_kernels = pytest.mark.skipif(not c_kernels_expected(), reason=NO_C_REASON)
