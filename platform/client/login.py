"""`loraplex login`: check a base URL and key against the server, then save them in the profile."""

from __future__ import annotations

import argparse
import getpass
import sys

from loraplex import envvars
from loraplex.platform.client import profile
from loraplex.platform.client.http import Api, UsageError, discover_tenant, run_guarded
from loraplex.platform.client.output import show


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "login", parents=[common], help="save the server's URL and your API key in a profile (a 0600 file)"
    )
    p.add_argument("--base-url", help="e.g. http://localhost:8000 (default: $LORAPLEX_BASE_URL)")
    p.add_argument("--api-key", help="the tenant's key (default: $LORAPLEX_API_KEY, else asked for)")
    p.add_argument("--tenant", help="the key's tenant name (found from your adapters when left out)")
    p.set_defaults(func=lambda args: run_guarded(lambda: login(args)))


def login(args: argparse.Namespace) -> int:
    base_url = args.base_url or envvars.client_base_url()
    if not base_url:
        raise UsageError("login needs --base-url (or LORAPLEX_BASE_URL)")
    api_key = args.api_key or envvars.client_api_key()
    if not api_key:
        if not sys.stdin.isatty():
            raise UsageError("login needs --api-key (or LORAPLEX_API_KEY)")
        api_key = getpass.getpass("API key: ")
    api = Api(base_url, api_key)
    try:
        tenant = args.tenant or discover_tenant(api)  # also proves the key works (401/403 otherwise)
    finally:
        api.close()
    fields = {"base_url": api.base_url, "api_key": api_key, "tenant": tenant}
    path = profile.save(args.profile, fields)
    out = {"profile": args.profile, "path": str(path), "base_url": api.base_url, "tenant": tenant}
    who = tenant or "a tenant not known yet (usage and keys will ask for --tenant)"
    show(args, out, f"logged in to {api.base_url} as {who}; profile {args.profile!r} saved in {path}")
    return 0
