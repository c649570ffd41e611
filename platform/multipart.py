"""Streaming multipart/form-data reception: file parts go straight to disk while the byte count is
checked against the limit, so an oversized upload is refused (413) as soon as it crosses the limit
instead of after being buffered."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from litestar import Request
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from loraplex.platform.errors import ApiError, bad_request

MAX_FIELD_BYTES = 4096


@dataclass
class UploadedFile:
    path: Path
    filename: str
    size: int = 0


@dataclass
class UploadedForm:
    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, UploadedFile] = field(default_factory=dict)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"upload exceeds the limit of {limit} bytes", code="request_too_large")


class _FormCollector:
    """python-multipart callbacks that route each part to memory (fields) or a file (uploads)."""

    def __init__(self, dest: Path, field_names: set[str], file_names: set[str]) -> None:
        self.dest = dest
        self.field_names = field_names
        self.file_names = file_names
        self.form = UploadedForm()
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._buffer: bytearray | None = None
        self._file: IO[bytes] | None = None
        self.error: ApiError | None = None

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._append("_header_field", d[s:e]),
            "on_header_value": lambda d, s, e: self._append("_header_value", d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _append(self, attr: str, data: bytes) -> None:
        setattr(self, attr, getattr(self, attr) + data)

    def _part_begin(self) -> None:
        self._headers = {}
        self._name = None

    def _header_end(self) -> None:
        self._headers[self._header_field.strip().lower()] = self._header_value.strip()
        self._header_field = self._header_value = b""

    def _fail(self, error: ApiError) -> None:
        if self.error is None:
            self.error = error
        raise FormParserError(error.message)

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        if name in self.form.fields or name in self.form.files:
            self._fail(bad_request(f"form part {name!r} given twice", param=name))
        if name in self.file_names and filename is not None:
            path = self.dest / f"part-{len(self.form.files)}"
            self.form.files[name] = UploadedFile(path, Path(filename.decode("utf-8", "replace")).name)
            self._file = open(path, "wb")
        elif name in self.field_names:
            self._buffer = bytearray()
        else:
            expected = sorted(self.field_names | self.file_names)
            kind = "file" if filename is not None else "field"
            self._fail(
                bad_request(f"unexpected form {kind} {name!r}; expected parts: {', '.join(expected)}", param=name)
            )
        self._name = name

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file is not None:
            self._file.write(data[start:end])
            self.form.files[self._name].size += end - start  # type: ignore[index]  # (_name is set with _file)
        elif self._buffer is not None:
            self._buffer += data[start:end]
            if len(self._buffer) > MAX_FIELD_BYTES:
                self._fail(
                    bad_request(f"form field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes", param=self._name)
                )

    def _part_end(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._buffer is not None and self._name is not None:
            try:
                self.form.fields[self._name] = self._buffer.decode("utf-8")
            except UnicodeDecodeError:
                self._fail(bad_request(f"form field {self._name!r} is not UTF-8", param=self._name))
            self._buffer = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


async def receive_form(
    request: Request, dest: Path, max_bytes: int, *, fields: set[str], files: set[str]
) -> UploadedForm:
    """Read a multipart body into `dest` (files) and memory (small fields), enforcing `max_bytes`."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or b"boundary" not in options:
        raise ApiError(415, "expected a multipart/form-data body (with a boundary)", code="unsupported_media_type")
    announced = request.headers.get("content-length")
    if announced is not None and announced.isdigit() and int(announced) > max_bytes:
        raise too_large(max_bytes)
    collector = _FormCollector(dest, fields, files)
    parser = MultipartParser(options[b"boundary"], collector.callbacks())  # type: ignore[arg-type]  # (typed there as a TypedDict)
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_bytes:
                raise too_large(max_bytes)
            if chunk:
                parser.write(chunk)
        parser.finalize()
    except FormParserError as exc:
        raise collector.error or bad_request(f"malformed multipart body: {exc}") from None
    finally:
        collector.close()
    return collector.form
