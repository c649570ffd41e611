"""How the engine's OpenMP threads (torch's and our C kernels': one libgomp pool) behave on a shared CPU.

At a barrier, libgomp spins up to GOMP_SPINCOUNT iterations (300,000 by default: a few hundred microseconds)
before it sleeps. When another process holds one of our cores, the team's other thread reaches each barrier
first and spins for its whole slice while the preempted one waits to run: Workload A beside one busy loop fell
to 0.38x of its alone throughput. With a spin of 1,000 iterations the waiting thread yields its core almost at
once: 0.55x beside the busy loop, alone unchanged within noise (bench/README.md has both, and OMP_WAIT_POLICY
passive, which costs 5% alone). The setting is read once, when libgomp loads with torch, so it is made by
``loraplex.envvars.openmp`` (a leaf) wherever a process starts: the engine package, the command line and the
benchmarks import it before torch; a value the user set (GOMP_SPINCOUNT or OMP_WAIT_POLICY) wins.

The thread count follows the CPUs this process may use: its affinity mask and its cgroup's CPU quota (what a
Kubernetes CPU limit sets), not the machine's cores (torch's default): threads beyond the quota only queue.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the cgroup's quota allows (cgroup v2 ``cpu.max``, or v1's cfs quota), None when unlimited."""
    v2 = root / "cpu.max"
    try:
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by its cgroup's quota (rounded up)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)


def size_threads() -> int:
    """Cap torch's thread count at the usable CPUs (never raise it: a user's smaller setting stays); the count."""
    import torch

    usable = usable_cpus()
    if torch.get_num_threads() > usable:
        torch.set_num_threads(usable)
    return int(torch.get_num_threads())
