#!/usr/bin/env bash
# Set up (idempotent) and run every test, the model-backed and service-backed ones included.
#
#   bash scripts/test.sh [PYTEST ARGS]            # the locked .venv (what .ci/run runs); args go to pytest
#   bash scripts/test.sh --latest [PYTEST ARGS]   # the same suite on the newest releases the ranges admit
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
if [ "${1:-}" = "--latest" ]; then
    shift
    venv=.venv-latest
    bash scripts/setup.sh --latest
else
    bash scripts/setup.sh
fi
# House style first: lint and formatting (configured in pyproject.toml).
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
# Types (mypy, configured in pyproject.toml): strict on grammar/ and engine/ (kernels/ and adapters/ are read for
# their types, their own errors not reported yet). MYPYPATH names this venv's link folder, so --latest checks
# against its own venv too.
MYPYPATH="$(pwd)/$venv/loraplex-mypy-path" "$venv/bin/mypy" -p loraplex.grammar -p loraplex.engine
# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link or anchor, and the reference pages are
# generated from the app's OpenAPI document, the CLI parser and the error codes as it builds (docs/hooks.py, which
# refuses to run with the checkout's root on sys.path). Built into a temporary folder, removed after.
site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --site-dir "$site"
rm -rf "$site"
# -P: the checkout's root stays off sys.path (loraplex/envvars/safe_path.py); the slowest tests are listed at the end.
exec "$venv/bin/python" -P -m pytest -q -p no:cacheprovider --durations=20 "$@"
