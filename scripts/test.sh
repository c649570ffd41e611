#!/usr/bin/env bash
# Set up (idempotent) and run every test, the model-backed and service-backed ones included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# House style first: lint and formatting (configured in pyproject.toml).
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
