"""Checking a batch input file, line by line, at upload: every refusal is a 400 that names the line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.adapters.json_depth import exceeds_depth
from loraplex.platform.batch.schemas import ENDPOINTS
from loraplex.platform.domain_errors import Invalid, TooLarge

MAX_CUSTOM_ID = 512
_KEYS = {"custom_id", "method", "url", "body"}


@dataclass(frozen=True)
class InputLine:
    line_no: int  # 1-based, as editors count
    custom_id: str
    url: str
    body: dict[str, Any]


def line_error(line_no: int, message: str, param: str = "file") -> Invalid:
    return Invalid(f"line {line_no}: {message}", param=param, code="invalid_batch_line")


def parse_line(line_no: int, raw: bytes, max_json_depth: int) -> InputLine:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise line_error(line_no, "not UTF-8") from None
    if exceeds_depth(text, max_json_depth):
        raise line_error(line_no, f"JSON nested deeper than {max_json_depth} levels (max_json_depth)")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise line_error(line_no, f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise line_error(line_no, "each line must be a JSON object {custom_id, method, url, body}")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise line_error(line_no, f"unknown field {unknown[0]!r}; a line has custom_id, method, url, body")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        raise line_error(line_no, f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters")
    if value.get("method") != "POST":
        raise line_error(line_no, f'method must be "POST", got {value.get("method")!r}')
    url = value.get("url")
    if url not in ENDPOINTS:
        raise line_error(line_no, f"url must be one of {', '.join(ENDPOINTS)}, got {url!r}")
    body = value.get("body")
    if not isinstance(body, dict):
        raise line_error(line_no, "body must be a JSON object (the request body of url)")
    if body.get("stream") not in (None, False):
        raise line_error(line_no, "body.stream is not supported in a batch (results go to the output file)")
    return InputLine(line_no, custom_id, url, body)


def read_lines(path: Path, max_json_depth: int, max_lines: int, max_line_bytes: int | None = None) -> list[InputLine]:
    """Every line of a JSONL batch input, checked; 400 for the first bad line, a repeated custom_id, an empty
    file, more than `max_lines` lines, or a line longer than `max_line_bytes` (the HTTP routes' body limit: a line
    is a request, held to what the same request sent alone may be). A final newline is optional; blank lines are
    refused."""
    lines: list[InputLine] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                raise line_error(line_no, "empty line")
            if line_no > max_lines:
                raise Invalid(f"more than {max_lines} lines (max_batch_lines)", param="file", code="too_many_lines")
            if max_line_bytes is not None and len(raw) > max_line_bytes:
                raise TooLarge(
                    f"line {line_no}: {len(raw)} bytes; a request is at most {max_line_bytes} bytes "
                    "(max_request_bytes), as on the HTTP routes",
                    param="file",
                    code="request_too_large",
                )
            line = parse_line(line_no, raw, max_json_depth)
            if line.custom_id in seen:
                raise line_error(line_no, f"custom_id {line.custom_id!r} repeats line {seen[line.custom_id]}")
            seen[line.custom_id] = line_no
            lines.append(line)
    if not lines:
        raise Invalid("the file has no lines", param="file", code="empty_file")
    return lines
