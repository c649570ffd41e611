"""`loraplex usage` and `loraplex keys list|rotate`: the caller's tenant."""

from __future__ import annotations

import argparse
import sys

from loraplex.platform.client import profile
from loraplex.platform.client.http import ApiError, Connection, client_command, seg, tenant_of
from loraplex.platform.client.output import emit, show
from loraplex.platform.tenants.keys import split_key

LIMITS = (
    ("queued_requests", "max_queued_requests"),
    ("sequences", "max_concurrent_sequences"),
    ("tokens_this_minute", "tokens_per_minute"),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    tenant = argparse.ArgumentParser(add_help=False)
    tenant.add_argument("--tenant", help="your tenant's name (default: saved at login, else found from your models)")

    p = sub.add_parser("usage", parents=[common, tenant], help="your tenant's use of its serving limits now")
    p.set_defaults(func=client_command(usage))

    group = sub.add_parser("keys", help="your tenant's API keys: list, rotate")
    cmds = group.add_subparsers(dest="keys_command", required=True)
    p = cmds.add_parser("list", parents=[common, tenant], help="your tenant's keys (prefixes only)")
    p.set_defaults(func=client_command(list_keys))
    p = cmds.add_parser(
        "rotate", parents=[common, tenant], help="create a new key, revoke the one in use, save the new one"
    )
    p.set_defaults(func=client_command(rotate))


def usage(args: argparse.Namespace, conn: Connection) -> int:
    out = conn.api.json("GET", f"/v1/tenants/{seg(tenant_of(args, conn))}/usage")
    rows = [{"counter": used, "now": out[used], "limit": out[limit] or "unlimited"} for used, limit in LIMITS]
    emit(args, out, ("counter", "now", "limit"), rows)
    return 0


def list_keys(args: argparse.Namespace, conn: Connection) -> int:
    emit(
        args,
        conn.api.json("GET", f"/v1/tenants/{seg(tenant_of(args, conn))}/keys"),
        ("prefix", "created_at", "revoked_at"),
    )
    return 0


def rotate(args: argparse.Namespace, conn: Connection) -> int:
    """A new key first, then the old one revoked with it; the profile (if the key came from one) is updated."""
    tenant = tenant_of(args, conn)
    base = f"/v1/tenants/{seg(tenant)}/keys"
    new = conn.api.json("POST", base)
    saved = None
    if conn.profile is not None:
        kept = profile.load(conn.profile) or {"base_url": conn.api.base_url}
        saved = profile.save(conn.profile, {**kept, "api_key": new["key"], "tenant": tenant})
    old_prefix = split_key(conn.api.api_key)
    conn.api.client.headers["Authorization"] = f"Bearer {new['key']}"
    try:
        revoked = conn.api.json("DELETE", f"{base}/{seg(old_prefix)}") if old_prefix else None
    except ApiError:
        if saved is None:
            print(f"new key (shown once): {new['key']}; the old one is still live", file=sys.stderr)
        raise
    out = {
        "new": {k: v for k, v in new.items() if saved is None or k != "key"},
        "revoked": revoked,
        "profile": conn.profile,
    }
    where = (
        f"saved in profile {conn.profile!r} ({saved})" if saved else f"{new['key']} (shown once: set LORAPLEX_API_KEY)"
    )
    show(args, out, f"new key {new['prefix']}: {where}; revoked key {old_prefix}")
    return 0
