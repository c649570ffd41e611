"""Registers the tenant commands beside `serve` in the `loraplex` parser."""

from __future__ import annotations

import argparse

from loraplex.platform.client import adapters, batch, chat, endpoints, login, tenant, tenants_admin
from loraplex.platform.client.profile import DEFAULT

COMMANDS = (
    "login",
    "tenants",
    "adapters",
    "endpoints",
    "batch",
    "usage",
    "keys",
    "chat",
)  # what `main` parses without the engine


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    common.add_argument("--profile", default=DEFAULT, help=f"the login profile to use (default: {DEFAULT})")
    for module in (login, tenants_admin, adapters, endpoints, batch, tenant, chat):
        module.register(sub, common)
