"""Benchmarks: start each as ``.venv/bin/python -P -m bench.<name>`` (safe path: see loraplex.envvars.safe_path)."""

from loraplex.envvars.safe_path import refuse_checkout_on_path

refuse_checkout_on_path("`.venv/bin/python -P -m bench.<name>`")
