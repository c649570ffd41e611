"""engine/openmp.py and envvars/openmp.py: the thread count follows the CPUs the process may use (affinity and the
cgroup's quota, v2 and v1 files as the kernel writes them), and the barrier spin is set only when the user chose
nothing and torch is not loaded yet (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loraplex.engine import openmp
from loraplex.envvars.openmp import SPINCOUNT, configure_waits


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert openmp.cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert openmp.cgroup_cpu_limit(tmp_path) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert openmp.cgroup_cpu_limit(tmp_path) == 0.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert openmp.cgroup_cpu_limit(tmp_path) is None
    assert openmp.cgroup_cpu_limit(tmp_path / "absent") is None


def test_threads_are_capped_by_the_quota_and_never_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(openmp, "cgroup_cpu_limit", lambda: 0.5)
        assert openmp.usable_cpus() == 1
        torch.set_num_threads(2)
        assert openmp.size_threads() == 1
        monkeypatch.setattr(openmp, "cgroup_cpu_limit", lambda: None)
        torch.set_num_threads(1)
        assert openmp.size_threads() == 1  # a smaller count (the user's) stays
    finally:
        torch.set_num_threads(before)


def test_the_spin_is_set_only_when_nobody_chose_and_before_torch() -> None:
    assert configure_waits({}) is False  # torch is loaded in this process: too late, nothing set
    code = "import os, sys\nimport loraplex.engine\nprint(os.environ.get('GOMP_SPINCOUNT'))\n"
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == SPINCOUNT
    chosen = subprocess.run(
        [sys.executable, "-P", "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True, text=True
    )
    assert chosen.stdout.strip() == "None"  # the user's policy wins
