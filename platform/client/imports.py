"""`loraplex adapters import SOURCE --name N [--sha256 H] [--wait]`: start an import by reference
(s3://, https://, hf://) and, with --wait, follow its status resource with a progress bar of the bytes
downloaded until it is ready (exit 0, the new version printed) or failed (exit 3, its code and reason)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tqdm import tqdm

from loraplex.platform.client.http import EXIT_OK, EXIT_REFUSED, Connection, client_command
from loraplex.platform.client.output import print_json

FINAL = {"ready", "failed"}
POLL_S = 0.5


def register(cmds: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = cmds.add_parser(
        "import", parents=[common], help="import an adapter by reference (s3://, https://, hf://) as a new version"
    )
    p.add_argument("source", help="s3://bucket/prefix, https://host/adapter.zip|.tar.gz, or hf://org/repo[@revision]")
    p.add_argument("--name", required=True, help="the adapter's name (an existing name gets a new version)")
    p.add_argument(
        "--sha256",
        help="the archive's SHA-256 (required for https:// sources); for an hf:// or s3:// folder, the weights "
        "file's (optional)",
    )
    p.add_argument(
        "--accept-failed-check",
        action="store_true",
        help="store the version even if the check at publish fails (recorded, with a warning)",
    )
    p.add_argument("--wait", action="store_true", help="follow the import to its end, with a progress bar")
    p.set_defaults(func=client_command(import_adapter))


def import_adapter(args: argparse.Namespace, conn: Connection) -> int:
    body: dict[str, Any] = {"name": args.name, "source": args.source}
    if args.sha256:
        body["sha256"] = args.sha256
    if args.accept_failed_check:
        body["accept_failed_check"] = True
    response = conn.api.request("POST", "/v1/adapters", json=body)
    status, location = response.json(), response.headers["location"]
    if args.wait:
        status = wait(conn, location, status)
    return report(args, status)


def wait(conn: Connection, location: str, status: dict[str, Any]) -> dict[str, Any]:
    """Poll the status resource until the import ends, showing its bytes downloaded."""
    with tqdm(total=None, unit="B", unit_scale=True, desc=f"import {status['name']}", disable=None) as bar:
        while True:
            if status["bytes_total"] is not None:
                bar.total = status["bytes_total"]
            bar.set_postfix_str(status["status"], refresh=False)
            bar.update(status["bytes_done"] - bar.n)
            if status["status"] in FINAL:
                return status
            time.sleep(POLL_S)
            status = conn.api.json("GET", location)


def report(args: argparse.Namespace, status: dict[str, Any]) -> int:
    if args.json:
        print_json(status)
    elif status["status"] == "ready":
        print(f"imported {status['name']} version {status['version']} (use {status['name']}@{status['version']})")
    else:
        print(
            f"import {status['id']}: {status['status']} (follow it: GET /v1/adapters/{status['name']}/imports/"
            f"{status['id']}, or --wait)"
        )
    if status["status"] == "failed":
        error = status["error"] or {}
        print(f"error {error.get('code')}: {error.get('message', 'the import failed')}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK
