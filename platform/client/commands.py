"""Registers the tenant commands beside `serve` in the `loraplex` parser."""

from __future__ import annotations

import argparse

from loraplex.platform.client import adapters, batch, endpoints, login, tenant
from loraplex.platform.client.profile import DEFAULT

COMMANDS = ("login", "adapters", "endpoints", "batch", "usage", "keys")  # what `main` parses without the engine


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    common.add_argument("--profile", default=DEFAULT, help=f"the login profile to use (default: {DEFAULT})")
    for module in (login, adapters, endpoints, batch, tenant):
        module.register(sub, common)
