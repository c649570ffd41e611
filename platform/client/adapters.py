"""`loraplex adapters push|import|merge|list|versions|rollback|delete`: the caller's adapters and their versions
(`import` lives in imports.py, `merge` in merge.py)."""

from __future__ import annotations

import argparse
import tempfile
import zipfile
from pathlib import Path

from loraplex.platform.client import imports, merge
from loraplex.platform.client.http import Connection, UsageError, client_command, seg
from loraplex.platform.client.output import emit, show
from loraplex.platform.client.upload import post_file

# The PEFT folder's files, as loraplex.adapters.files names them (not imported: that package loads torch).
CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
COLUMNS = ("name", "version", "model", "status", "rank", "size_bytes", "created_at")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("adapters", help="your LoRA adapters: push, import, merge, list, versions, rollback, delete")
    cmds = group.add_subparsers(dest="adapters_command", required=True)

    p = cmds.add_parser("push", parents=[common], help="zip a PEFT adapter folder and upload it (a new version)")
    p.add_argument("folder", type=Path, help="the folder peft's save_pretrained wrote")
    p.add_argument("--name", required=True, help="the adapter's name (an existing name gets a new version)")
    p.add_argument(
        "--accept-failed-check",
        action="store_true",
        help="store the version even if the check at publish fails (recorded, with a warning)",
    )
    p.set_defaults(func=client_command(push))
    imports.register(cmds, common)
    merge.register(cmds, common)

    p = cmds.add_parser("list", parents=[common], help="your adapters (each at its current version)")
    p.set_defaults(func=client_command(list_adapters))

    p = cmds.add_parser("versions", parents=[common], help="every kept version of one adapter")
    p.add_argument("name")
    p.set_defaults(func=client_command(versions))

    p = cmds.add_parser("rollback", parents=[common], help="make VERSION the one NAME resolves to")
    p.add_argument("name")
    p.add_argument("version", type=int)
    p.set_defaults(func=client_command(rollback))

    p = cmds.add_parser("delete", parents=[common], help="delete NAME (every version) or NAME@N (one version)")
    p.add_argument("name", metavar="NAME[@N]")
    p.set_defaults(func=client_command(delete))


def zip_adapter(folder: Path, dest: Path) -> Path:
    """Zip the folder's files (hidden ones left out) at the archive's top level, as the server expects."""
    if not (folder / CONFIG_NAME).is_file():
        raise UsageError(f"{folder} is no PEFT adapter folder: it has no {CONFIG_NAME}")
    if not (folder / WEIGHTS_NAME).is_file():
        raise UsageError(f"{folder} has no {WEIGHTS_NAME} (save the adapter with peft's safetensors default)")
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(folder.rglob("*")):
            rel = f.relative_to(folder)
            if f.is_file() and not any(part.startswith(".") for part in rel.parts):
                zf.write(f, rel.as_posix())
    return dest


def push(args: argparse.Namespace, conn: Connection) -> int:
    with tempfile.TemporaryDirectory(prefix="loraplex-push-") as tmp:
        archive = zip_adapter(args.folder, Path(tmp) / f"{args.name}.zip")
        fields = {"name": args.name} | ({"accept_failed_check": "true"} if args.accept_failed_check else {})
        out = post_file(conn.api, "/v1/adapters", fields, "file", archive.name, archive)
    show(
        args,
        out,
        f"pushed {out['model']} version {out['version']} (use {out['name']}@{out['version']}), sha256 {out['sha256']}",
    )
    return 0


def list_adapters(args: argparse.Namespace, conn: Connection) -> int:
    emit(args, conn.api.json("GET", "/v1/adapters"), COLUMNS)
    return 0


def versions(args: argparse.Namespace, conn: Connection) -> int:
    out = conn.api.json("GET", f"/v1/adapters/{seg(args.name)}/versions")
    rows = [{"current": "*" if v["version"] == out["current"] else "", **v} for v in out["data"]]
    emit(args, out, ("current", *COLUMNS), rows)
    return 0


def rollback(args: argparse.Namespace, conn: Connection) -> int:
    out = conn.api.json("PUT", f"/v1/adapters/{seg(args.name)}/current", json={"version": args.version})
    show(args, out, f"{out['name']} now resolves to version {out['version']}")
    return 0


def delete(args: argparse.Namespace, conn: Connection) -> int:
    out = conn.api.json("DELETE", f"/v1/adapters/{seg(args.name)}")
    what = args.name if "@" in args.name else f"{args.name} (every version)"
    show(args, out, f"deleted {what}")
    return 0
