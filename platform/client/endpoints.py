"""`loraplex endpoints list|create|show|split|promote|rollback|delete`: published endpoints and their canaries."""

from __future__ import annotations

import argparse
import json
from typing import Any

from loraplex.platform.client.http import Connection, client_command, seg
from loraplex.platform.client.output import emit

COLUMNS = ("name", "revision", "adapter", "canary", "shadow", "pinned", "updated_at")
ONE_COLUMNS = (*COLUMNS, "description")  # one endpoint: its description too (too long for the list)


def json_object(text: str) -> dict[str, Any]:
    """argparse type: a JSON object (a bad one is a usage error)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError("must be between 0 and 1 (exclusive)")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("endpoints", help="your endpoints: create, show, split (canary), promote, rollback")
    cmds = group.add_subparsers(dest="endpoints_command", required=True)

    p = cmds.add_parser("list", parents=[common], help="your endpoints")
    p.set_defaults(func=client_command(list_endpoints))

    p = cmds.add_parser("create", parents=[common], help="publish an endpoint: an adapter version with defaults")
    p.add_argument("name")
    p.add_argument("--adapter", help="NAME@N, or NAME (its current version, pinned); left out: the base model")
    p.add_argument("--defaults", type=json_object, help="request defaults, e.g. '{\"max_tokens\": 64}'")
    p.add_argument("--overridable", nargs="+", default=[], metavar="FIELD", help="fields callers may override")
    p.add_argument("--pinned", action="store_true", help="keep its versions loaded in every replica")
    p.add_argument("--description", help="what the endpoint is for (free text, at most 1,000 characters)")
    p.set_defaults(func=client_command(create))

    p = cmds.add_parser("show", parents=[common], help="one endpoint")
    p.add_argument("name")
    p.set_defaults(func=client_command(show_endpoint))

    p = cmds.add_parser("split", parents=[common], help="serve adapter VERSION to WEIGHT of callers (a canary)")
    p.add_argument("name")
    p.add_argument("version", type=int)
    p.add_argument("weight", type=fraction, help="the canary's share, in (0, 1)")
    p.set_defaults(func=client_command(split))

    for action, text in (("promote", "the canary's version serves every caller"), ("rollback", "drop the canary")):
        p = cmds.add_parser(action, parents=[common], help=text)
        p.add_argument("name")
        p.set_defaults(func=client_command(promote if action == "promote" else rollback))

    p = cmds.add_parser("delete", parents=[common], help="delete an endpoint")
    p.add_argument("name")
    p.set_defaults(func=client_command(delete))


def _one(args: argparse.Namespace, out: dict[str, Any]) -> int:
    emit(args, out, ONE_COLUMNS, [{**out, "canary": canary_text(out["canary"])}])
    return 0


def canary_text(canary: dict[str, Any] | None) -> str | None:
    return None if canary is None else f"v{canary['version']} at {canary['weight']:g}"


def list_endpoints(args: argparse.Namespace, conn: Connection) -> int:
    out = conn.api.json("GET", "/v1/endpoints")
    emit(args, out, COLUMNS, [{**e, "canary": canary_text(e["canary"])} for e in out["data"]])
    return 0


def create(args: argparse.Namespace, conn: Connection) -> int:
    body: dict[str, Any] = {"name": args.name, "adapter": args.adapter, "overridable": args.overridable}
    if args.defaults is not None:
        body["defaults"] = args.defaults
    if args.pinned:
        body["pinned"] = True
    if args.description is not None:
        body["description"] = args.description
    return _one(args, conn.api.json("POST", "/v1/endpoints", json=body))


def show_endpoint(args: argparse.Namespace, conn: Connection) -> int:
    return _one(args, conn.api.json("GET", f"/v1/endpoints/{seg(args.name)}"))


def split(args: argparse.Namespace, conn: Connection) -> int:
    canary = {"version": args.version, "weight": args.weight}
    return _one(args, conn.api.json("PATCH", f"/v1/endpoints/{seg(args.name)}", json={"canary": canary}))


def promote(args: argparse.Namespace, conn: Connection) -> int:
    return _one(args, conn.api.json("POST", f"/v1/endpoints/{seg(args.name)}/promote"))


def rollback(args: argparse.Namespace, conn: Connection) -> int:
    return _one(args, conn.api.json("POST", f"/v1/endpoints/{seg(args.name)}/rollback"))


def delete(args: argparse.Namespace, conn: Connection) -> int:
    return _one(args, conn.api.json("DELETE", f"/v1/endpoints/{seg(args.name)}"))
