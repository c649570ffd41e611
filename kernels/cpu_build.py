"""Compiles the C kernels in ``csrc/`` once per machine and loads them with ctypes.

The shared object lands in ``$LORAPLEX_KERNEL_CACHE`` (default ``<cache dir>/kernels``) under a name that
hashes the source and the shared headers, the compiler command and the CPU's feature flags, so an edited
source or a different CPU gets its own build (``-march=native``), and a half-written file is never loaded
(it is renamed into place only once the compiler succeeds). Without a C compiler, or with
``LORAPLEX_CPU_KERNELS=0``, :func:`load` returns None and callers use their torch paths. A compiler that
fails, or a library that does not load, is an error (``KernelBuildError``, naming the kernel and the
compiler's message), never a quiet fallback: a kernel that stops compiling must fail its tests.

OpenMP: the objects link ``libgomp.so.1``; torch's CPU wheel has already loaded its own copy under that
soname, so the dynamic linker binds ours to it and the kernels share torch's thread pool rather than
starting a second one that would spin against it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from loraplex import envvars as env

logger = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
# -ffp-contract=fast: in ISO C mode GCC would keep every multiply and add separate (no FMA)
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | KernelBuildError | None] = {}


class KernelBuildError(RuntimeError):
    """A C kernel that a present compiler failed to build, or whose library failed to load."""


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def compiler() -> str | None:
    """The C compiler to build with: $CC, else cc or gcc on the PATH (None: there is none)."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


Signatures = dict[str, tuple[object, list]]  # C function name -> (restype, argtypes)


def load(name: str, signatures: Signatures, extra_flags: Sequence[str] = ()) -> ctypes.CDLL | None:
    """The compiled ``csrc/<name>.c``, built on first use, with ``signatures`` set on its functions once;
    None when C kernels are switched off or there is no C compiler. Raises KernelBuildError (every time,
    without building again) when the build or the load failed.

    ``extra_flags`` (e.g. ``-DSOME_MACRO``) build a variant of the kernel beside the plain one: its own
    library, cached under its own key (the plain build's key is unchanged)."""
    extra = list(extra_flags)
    key = " ".join([name, *extra])
    with _lock:
        if key not in _loaded:
            try:
                lib = _build_and_load(name, extra)
                if lib is not None:
                    for fn_name, (restype, argtypes) in signatures.items():
                        fn = getattr(lib, fn_name)
                        fn.restype, fn.argtypes = restype, argtypes
            except KernelBuildError as exc:
                _loaded[key] = exc
            except AttributeError as exc:  # a function the signatures name is missing from the library
                _loaded[key] = KernelBuildError(f"C kernel {key}: {exc}")
            else:
                _loaded[key] = lib
        found = _loaded[key]
        if isinstance(found, KernelBuildError):
            raise found
        return found


def _build_and_load(name: str, extra: list[str]) -> ctypes.CDLL | None:
    if not env.cpu_kernels_enabled():
        return None
    cc = compiler()
    if cc is None:
        logger.warning("no C compiler found: the CPU runs the torch paths instead of the C kernels")
        return None
    source = CSRC / f"{name}.c"
    label = " ".join([name, *extra])  # the kernel as errors name it: a variant with its flags
    headers = b"".join(h.read_bytes() for h in sorted(CSRC.glob("*.h")))  # an edited shared header rebuilds too
    command = " ".join([cc, *FLAGS, *extra])  # without extra flags, the same key as before they existed
    key = hashlib.sha256(source.read_bytes() + headers + command.encode() + _cpu_signature().encode())
    target = env.kernel_cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            try:
                proc = subprocess.run(
                    [cc, *FLAGS, *extra, str(source), "-o", tmp, "-lm"], capture_output=True, text=True
                )
            except OSError as exc:
                raise KernelBuildError(f"C kernel {label}: cannot run the compiler {cc!r}: {exc}") from exc
            if proc.returncode != 0:
                raise KernelBuildError(
                    f"C kernel {label}: {cc} failed to build {source.name} (exit "
                    f"{proc.returncode}):\n{(proc.stderr or proc.stdout)[-2000:]}"
                )
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        raise KernelBuildError(f"C kernel {label}: cannot load {target}: {exc}") from exc
