"""`loraplex adapters merge NAME --source a@2:0.7 --source b --method svd`: a new version of NAME merged from the
caller's adapters on the server (POST /v1/adapters/{name}/merge; peft's add_weighted_adapter methods)."""

from __future__ import annotations

import argparse

from loraplex.platform.client.http import Connection, UsageError, client_command, seg
from loraplex.platform.client.output import show

METHODS = ("cat", "linear", "svd", "ties", "dare_linear", "dare_ties", "magnitude_prune")


def register(cmds: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = cmds.add_parser(
        "merge", parents=[common], help="merge some of your adapters into a new version of NAME (on the server)"
    )
    p.add_argument("name", help="the adapter name the merged version is published under")
    p.add_argument(
        "--source",
        action="append",
        required=True,
        metavar="MODEL[:WEIGHT]",
        help="a source adapter (`name` for its current version or `name@N`), weight 1 unless given; twice or more",
    )
    p.add_argument("--method", required=True, choices=METHODS, help="how to combine them (peft's names)")
    p.add_argument("--density", type=float, help="ties, dare_*, magnitude_prune: the fraction of values kept")
    p.add_argument("--svd-rank", type=int, help="svd: the merged rank (default: the largest source rank)")
    p.add_argument("--majority-sign-method", choices=("total", "frequency"), help="ties, dare_ties")
    p.add_argument("--seed", type=int, help="dare_*: the random seed (drawn and recorded by the server otherwise)")
    p.add_argument(
        "--accept-failed-check", action="store_true", help="store it even if the check at publish fails (warned)"
    )
    p.set_defaults(func=client_command(merge))


def parse_source(text: str) -> dict[str, object]:
    """`model` or `model:weight` as the route's source object; a malformed weight is a usage error."""
    model, sep, weight = text.rpartition(":") if ":" in text else (text, "", "")
    if not model:
        raise UsageError(f"--source {text!r}: expected MODEL or MODEL:WEIGHT")
    if not sep:
        return {"model": model}
    try:
        return {"model": model, "weight": float(weight)}
    except ValueError:
        raise UsageError(f"--source {text!r}: the weight {weight!r} is not a number") from None


def merge(args: argparse.Namespace, conn: Connection) -> int:
    if len(args.source) < 2:
        raise UsageError("a merge needs at least two --source adapters")
    body: dict[str, object] = {"sources": [parse_source(s) for s in args.source], "method": args.method}
    for field in ("density", "svd_rank", "majority_sign_method", "seed"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    if args.accept_failed_check:
        body["accept_failed_check"] = True
    out = conn.api.json("POST", f"/v1/adapters/{seg(args.name)}/merge", json=body)
    sources = ", ".join(f"{s['name']}@{s['version']} x{s['weight']}" for s in out["origin"]["sources"])
    show(args, out, f"merged {sources} ({args.method}) into {out['model']} version {out['version']}")
    return 0
