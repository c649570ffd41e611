"""The wheel carries every module of every package (a missing entry in pyproject's package list shows here)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {
    "engine": "loraplex/engine",
    "kernels": "loraplex/kernels",
    "adapters": "loraplex/adapters",
    "grammar": "loraplex/grammar",
    "platform": "loraplex/platform",
    "migrations": "loraplex/migrations",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        check=True,
    )
    return next(out.glob("loraplex-*.whl"))


def test_wheel_contains_every_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for folder, pkg in FOLDERS.items():
        for src in (REPO / folder).rglob("*.py"):
            if "__pycache__" in src.parts:
                continue
            rel = src.relative_to(REPO / folder).as_posix()
            if f"{pkg}/{rel}" not in names:
                missing.append(f"{pkg}/{rel}")
    assert not missing, f"modules missing from the wheel (add their packages to pyproject.toml): {missing}"
    assert not any(n.startswith("platform/") or n == "loraplex/platform/__init__.py" for n in names)
    assert "loraplex/migrations/script.py.mako" in names
    for src in (REPO / "kernels" / "csrc").glob("*.c"):  # the C kernels are compiled on first use
        assert f"loraplex/kernels/csrc/{src.name}" in names


def test_no_init_in_platform_and_stdlib_platform_still_imports():
    assert not (REPO / "platform" / "__init__.py").exists()
    code = "import platform, torch; print(platform.system())"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)


def test_every_module_imports():
    for folder, pkg in FOLDERS.items():
        for src in sorted((REPO / folder).rglob("*.py")):
            if "__pycache__" in src.parts or src.name.startswith("_triton") or folder == "migrations":
                continue
            mod = (
                pkg.replace("/", ".")
                + "."
                + src.relative_to(REPO / folder).with_suffix("").as_posix().replace("/", ".")
            )
            mod = mod.removesuffix(".__init__")
            __import__(mod)
