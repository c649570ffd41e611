"""`loraplex batch submit|status`: upload a JSONL file, start a batch job, and with `--wait` follow it with a
progress bar and download its output and error files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loraplex.platform.client.http import EXIT_OK, EXIT_REFUSED, Connection, UsageError, client_command, seg
from loraplex.platform.client.output import print_json
from loraplex.platform.client.upload import post_file

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
FINAL = {"completed", "failed", "expired", "cancelled"}
POLL_S = 0.5


def endpoint_path(text: str) -> str:
    """argparse type: `chat`, `completions` or the route itself."""
    return ENDPOINTS.get(text, text)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("batch", help="batch jobs: submit a JSONL file, follow it, download its results")
    cmds = group.add_subparsers(dest="batch_command", required=True)

    p = cmds.add_parser("submit", parents=[common], help="upload FILE and start a batch job over its lines")
    p.add_argument("file", type=Path, help="JSONL: one {custom_id, method, url, body} request a line")
    p.add_argument(
        "--endpoint",
        type=endpoint_path,
        default=ENDPOINTS["chat"],
        help="the lines' route: chat (/v1/chat/completions, the default) or completions (/v1/completions)",
    )
    p.add_argument("--wait", action="store_true", help="follow the job to its end and download its files")
    p.add_argument("--output-dir", type=Path, default=Path("."), help="where --wait puts the files (default: .)")
    p.set_defaults(func=client_command(submit))

    p = cmds.add_parser("status", parents=[common], help="one batch job")
    p.add_argument("batch_id")
    p.set_defaults(func=client_command(status))


def submit(args: argparse.Namespace, conn: Connection) -> int:
    if not args.file.is_file():
        raise UsageError(f"{args.file} is not a file")
    uploaded = post_file(conn.api, "/v1/files", {"purpose": "batch"}, "file", args.file.name, args.file)
    body = {"input_file_id": uploaded["id"], "endpoint": args.endpoint, "completion_window": "24h"}
    batch = conn.api.json("POST", "/v1/batches", json=body)
    if not args.wait:
        _report(args, batch)
        return EXIT_OK
    batch = wait(conn, batch)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for kind, key in (("output", "output_file_id"), ("errors", "error_file_id")):
        if batch.get(key):
            dest = args.output_dir / f"{batch['id']}.{kind}.jsonl"
            conn.api.download(f"/v1/files/{seg(batch[key])}/content", dest, desc=f"download {kind}")
            files[kind] = str(dest)
    _report(args, batch, files)
    return EXIT_OK if batch["status"] == "completed" else EXIT_REFUSED


def wait(conn: Connection, batch: dict[str, Any]) -> dict[str, Any]:
    """Poll the job until it ends, showing its finished lines (completed + failed) out of its total."""
    with tqdm(total=batch["request_counts"]["total"], unit="line", desc=batch["id"], disable=None) as bar:
        while True:
            counts = batch["request_counts"]
            bar.total = counts["total"]
            bar.update(counts["completed"] + counts["failed"] - bar.n)
            if batch["status"] in FINAL:
                return batch
            time.sleep(POLL_S)
            batch = conn.api.json("GET", f"/v1/batches/{seg(batch['id'])}")


def status(args: argparse.Namespace, conn: Connection) -> int:
    _report(args, conn.api.json("GET", f"/v1/batches/{seg(args.batch_id)}"))
    return EXIT_OK


def _report(args: argparse.Namespace, batch: dict[str, Any], files: dict[str, str] | None = None) -> None:
    if args.json:
        print_json(batch if files is None else {**batch, "downloaded": files})
        return
    c = batch["request_counts"]
    print(f"batch {batch['id']}: {batch['status']} ({c['completed']} completed, {c['failed']} failed of {c['total']})")
    for kind, path in (files or {}).items():
        print(f"{kind}: {path}")
    if batch["status"] in FINAL - {"completed"}:
        print(f"error batch_{batch['status']}: the batch ended {batch['status']}", file=sys.stderr)
