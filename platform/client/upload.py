"""A multipart upload streamed from a file (never held in memory), with a progress bar on stderr."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from loraplex.platform.client.http import Api

CHUNK = 1 << 20


def multipart(
    fields: dict[str, str], file_field: str, filename: str, path: Path, desc: str
) -> tuple[dict[str, str], Iterator[bytes]]:
    """Headers (with Content-Length) and a generator yielding the form: `fields`, then the file's bytes."""
    boundary = secrets.token_hex(16)
    head = "".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    )
    head += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    tail = f"\r\n--{boundary}--\r\n".encode()
    size = path.stat().st_size
    first = head.encode()

    def body() -> Iterator[bytes]:
        yield first
        with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=desc, disable=None) as bar:
            while chunk := f.read(CHUNK):
                bar.update(len(chunk))
                yield chunk
        yield tail

    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(first) + size + len(tail)),
    }
    return headers, body()


def post_file(api: Api, route: str, fields: dict[str, str], file_field: str, filename: str, path: Path) -> Any:
    """POST `path` as the form's `file_field` (streamed) and return the JSON answer."""
    headers, body = multipart(fields, file_field, filename, path, desc=f"upload {path.name}")
    return api.json("POST", route, content=body, headers=headers, timeout=httpx.Timeout(600.0, connect=10.0))
