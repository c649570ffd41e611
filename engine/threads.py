"""Torch work off the engine thread runs on one OpenMP thread.

With libgomp (PyTorch's CPU wheels) every thread that enters a parallel region gets a team of its own.
Once the process holds more OpenMP threads than CPUs, libgomp stops spin-waiting at barriers and parks
threads on futexes for good, so every small parallel op of the engine thread pays a wake-up, for the rest
of the process, after a single matmul in an adapter-loader thread (bench/README.md has the figures). Helper threads
that touch torch (adapter loading and checks) call `single_threaded_torch` first; their work is small
next to the engine's, and the engine thread keeps every core.

`torch.set_num_threads(1)` would do it too, but it also sets the count that every thread adopts on its
first torch op, so a thread started later (the server's engine thread) would run single-threaded.
Instead this thread's own OpenMP setting is changed, after torch has initialised it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import lru_cache

import torch


@lru_cache(maxsize=1)
def _omp_set_num_threads() -> Callable[[int], object] | None:
    try:
        return ctypes.CDLL("libgomp.so.1").omp_set_num_threads  # the copy torch loaded (same soname)
    except (OSError, AttributeError):
        return None


def single_threaded_torch() -> None:
    """Make the calling thread's torch ops run on this thread alone, leaving other threads' counts as they are.

    Covers torch's own parallel ops (OpenMP), which is what adapter loading and checking run; an MKL matmul
    in such a thread would still use MKL's count.
    """
    setter = _omp_set_num_threads()
    if setter is None:
        torch.set_num_threads(1)
        return
    torch.get_num_threads()  # initialises this thread's settings in torch first, so they are not reapplied later
    setter(1)
