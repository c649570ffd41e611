"""A batch's output and error files, built from its lines' stored results in input order (OpenAI's line
shape: {id, custom_id, response: {status_code, request_id, body}, error}). Lines a cancelled or expired batch
never ran go to the error file with `error: {code, message}` and no response, so no line goes unmentioned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from loraplex.platform.batch import ids
from loraplex.platform.db.models import BatchLine
from loraplex.platform.error_codes import ErrorCode

UNRUN: dict[str, tuple[ErrorCode, str]] = {
    "cancelled": ("batch_cancelled", "the batch was cancelled before this request ran"),
    "expired": ("batch_expired", "the batch's completion window ended before this request ran"),
}


def output_line(line: BatchLine, final_status: str) -> tuple[bool, dict[str, Any]]:
    """(goes to the output file, the line's JSON)."""
    entry: dict[str, Any] = {"id": ids.public(ids.LINE, line.id), "custom_id": line.custom_id}
    if line.status_code is None:
        code, message = UNRUN.get(final_status, ("batch_failed", "this request did not run"))
        return False, {**entry, "response": None, "error": {"code": code, "message": message}}
    response = {"status_code": line.status_code, "request_id": line.request_id, "body": line.response}
    return 200 <= line.status_code < 300, {**entry, "response": response, "error": None}


class JsonlWriter:
    """Appends JSON lines to a file, counting them and their bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        self.size = 0
        self._file: IO[bytes] = open(path, "wb")

    def write(self, value: dict[str, Any]) -> None:
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        self._file.write(data)
        self.lines += 1
        self.size += len(data)

    def close(self) -> None:
        self._file.close()
