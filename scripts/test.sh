#!/usr/bin/env bash
# Set up (idempotent) and run every test, the model-backed and service-backed ones included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
