"""Benchmarks: start each as ``.venv/bin/python -P -m bench.<name>`` (safe path: see loraplex.envvars.safe_path)."""

import loraplex.envvars.openmp  # noqa: F401  # OpenMP's barrier waits, before any benchmark loads torch
from loraplex.envvars.safe_path import refuse_checkout_on_path

refuse_checkout_on_path("`.venv/bin/python -P -m bench.<name>`")
