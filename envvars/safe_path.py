"""The checkout's root is never on ``sys.path``.

Its folders carry common names (``kernels/``, ``platform/``, ``engine/``, ``adapters/`` ...) and are imported
only as ``loraplex.*`` through the editable install's mapping. With the root on ``sys.path`` they would
shadow installed packages and the standard library: Hugging Face's ``kernels``, which transformers imports,
would resolve to our ``kernels/``. Python puts the root there for ``python -m X`` and ``python -c`` started
from it, so every command loraplex documents or spawns runs Python in safe-path mode (``-P``), and the
entry points that could be started otherwise (the benchmarks, the test suite, the CLI) refuse to run with
the root on the path instead of failing later somewhere inside a dependency. ``tests`` and ``bench`` are
reached through a folder of their own that ``scripts/setup.sh`` puts on the path (``.venv/loraplex-dev-path``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def checkout_root() -> Path | None:
    """The source checkout this package runs from, or None for an installed wheel."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "kernels").is_dir() else None


def checkout_entries(path: list[str] | None = None) -> list[str]:
    """The entries of ``sys.path`` (or ``path``) that name the checkout's root ('' is the working directory)."""
    root = checkout_root()
    if root is None:
        return []
    found = []
    for entry in sys.path if path is None else path:
        try:
            if Path(entry or os.getcwd()).resolve() == root:
                found.append(entry)
        except OSError:
            continue
    return found


def refuse_checkout_on_path(command: str) -> None:
    """Stop with a message naming the fix when the checkout's root is on ``sys.path``."""
    entries = checkout_entries()
    if entries:
        raise SystemExit(
            f"the checkout {checkout_root()} is on sys.path (as {entries!r}): its folders would shadow installed "
            f"packages (Hugging Face's `kernels`) and the standard library; start Python in safe-path mode: "
            f"{command}"
        )


def python_module_command(module: str, *args: str) -> list[str]:
    """``python -P -m module args...`` with this interpreter: how loraplex starts a Python child process."""
    return [sys.executable, "-P", "-m", module, *args]
