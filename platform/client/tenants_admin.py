"""`loraplex tenants create NAME`: the admin's first step for a newcomer (POST /v1/tenants with the admin key),
optionally saving the new tenant's key as a login profile so the next command needs nothing else."""

from __future__ import annotations

import argparse

from loraplex import envvars
from loraplex.platform.client import profile
from loraplex.platform.client.http import Api, UsageError, run_guarded
from loraplex.platform.client.output import show


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("tenants", help="tenants (admin): create one and log in as it")
    cmds = group.add_subparsers(dest="tenants_command", required=True)
    p = cmds.add_parser("create", parents=[common], help="create a tenant with the admin key; prints its API key once")
    p.add_argument("name", help="the tenant's name")
    p.add_argument("--base-url", help="e.g. http://localhost:8000 (default: $LORAPLEX_BASE_URL, else the profile's)")
    p.add_argument(
        "--admin-key", help="the server's admin key (default: $LORAPLEX_ADMIN_KEY, the variable `serve` reads)"
    )
    p.add_argument("--login", action="store_true", help="save the new tenant's URL and key as the login profile (0600)")
    p.set_defaults(func=lambda args: run_guarded(lambda: create(args)))


def create(args: argparse.Namespace) -> int:
    saved = profile.load(args.profile) or {}
    base_url = args.base_url or envvars.client_base_url() or saved.get("base_url")
    if not base_url:
        raise UsageError("tenants create needs --base-url (or LORAPLEX_BASE_URL, or a login profile)")
    admin_key = args.admin_key or envvars.setting("admin_key")
    if not admin_key:
        raise UsageError("tenants create needs --admin-key (or LORAPLEX_ADMIN_KEY): `loraplex serve` printed it")
    api = Api(base_url, admin_key)
    try:
        out = api.json("POST", "/v1/tenants", json={"name": args.name})
    finally:
        api.close()
    key = out["api_key"]["key"]
    if args.login:
        path = profile.save(args.profile, {"base_url": api.base_url, "api_key": key, "tenant": args.name})
        shown = {**out, "api_key": {k: v for k, v in out["api_key"].items() if k != "key"}, "profile": str(path)}
        show(args, shown, f"tenant {args.name} created; its key is saved in profile {args.profile!r} ({path})")
    else:
        show(args, out, f"tenant {args.name} created; its API key (shown once): {key}")
    return 0
