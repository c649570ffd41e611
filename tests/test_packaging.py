"""The wheel carries every module of every package (a missing entry in pyproject's package list shows here)."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {
    "envvars": "loraplex/envvars",
    "scratch": "loraplex/scratch",
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
    console = REPO / "platform" / "console" / "static"
    for src in console.rglob("*"):  # the web console's page, styles and scripts (package data)
        if src.is_file():
            assert f"loraplex/platform/console/static/{src.relative_to(console).as_posix()}" in names


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


# --- the checkout's root never shadows an installed package (loraplex/envvars/safe_path.py) ---------------------


def test_suite_runs_with_the_checkout_off_sys_path_and_hugging_face_kernels_imports():
    """The suite's own interpreter: Hugging Face's `kernels` (a transformers dependency) is the installed one."""
    from loraplex.envvars.safe_path import checkout_entries

    assert not checkout_entries(), "the suite was started with the checkout's root on sys.path"
    assert importlib.util.find_spec("kernels") is not None, "Hugging Face's `kernels` must be installed (test extra)"
    import kernels

    assert _installed(kernels.__file__), kernels.__file__
    importlib.import_module("transformers.integrations.hub_kernels")  # what failed on a fresh machine


def _installed(file: str) -> bool:
    path = Path(file).resolve()
    return "site-packages" in path.parts and path != REPO / "kernels" / "__init__.py"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_without_safe_path_the_checkout_shadows_kernels():
    """The hazard the safe path exists for is real here (this test would pass vacuously otherwise)."""
    out = _run([sys.executable, "-c", "import kernels; print(kernels.__file__)"])
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve() == REPO / "kernels" / "__init__.py"


def test_benchmarks_start_in_safe_path_mode_and_refuse_otherwise():
    code = "import bench.common, kernels, transformers.integrations.hub_kernels; print(kernels.__file__)"
    out = _run([sys.executable, "-P", "-c", code])
    assert out.returncode == 0, out.stderr
    assert _installed(out.stdout.strip()), out.stdout
    documented = _run([sys.executable, "-P", "-m", "bench.throughput", "--help"])
    assert documented.returncode == 0, documented.stderr
    unsafe = _run([sys.executable, "-m", "bench.throughput", "--help"])
    assert unsafe.returncode != 0 and "-P -m bench." in unsafe.stderr, unsafe.stderr


def test_child_processes_loraplex_starts_keep_the_checkout_off_sys_path():
    """Grammar workers, servers in tests and benchmarks: `python -m site` prints the path such a child sees."""
    from loraplex.envvars.safe_path import python_module_command

    child = _run(python_module_command("site"))
    assert child.returncode == 0, child.stderr
    assert f"'{REPO}'," not in child.stdout, child.stdout
    control = _run([sys.executable, "-m", "site"])
    assert f"'{REPO}'," in control.stdout, control.stdout


def test_cli_refuses_to_run_with_the_checkout_on_sys_path():
    out = _run([sys.executable, "-m", "loraplex.platform.cli", "--help"])
    assert out.returncode != 0 and "safe-path mode" in out.stderr, out.stderr
    console = subprocess.run(
        [str(Path(sys.executable).parent / "loraplex"), "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert console.returncode == 0, console.stderr
