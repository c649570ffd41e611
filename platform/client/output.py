"""Human tables by default, the API's JSON with `--json`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """A left-aligned table with a header row; `(none)` when there are no rows."""
    if not rows:
        print("(none)")
        return
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    for line in [list(columns), *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())


def emit(
    args: argparse.Namespace, data: Any, columns: Sequence[str], rows: Sequence[dict[str, Any]] | None = None
) -> None:
    """The API's JSON (`--json`), else a table of `rows` (default: `data`'s `data` list, or `data` alone)."""
    if args.json:
        print_json(data)
        return
    if rows is None:
        rows = data["data"] if isinstance(data, dict) and isinstance(data.get("data"), list) else [data]
    print_table(rows, columns)


def show(args: argparse.Namespace, data: dict[str, Any], message: str) -> None:
    """The API's JSON (`--json`), else one line for humans."""
    if args.json:
        print_json(data)
    else:
        print(message)
