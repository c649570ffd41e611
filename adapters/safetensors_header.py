"""Validation of a .safetensors file's header, done by us before safetensors sees the file.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the tensor data. Every tensor's
``data_offsets`` are relative to the data start; together they must tile the data region exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .errors import AdapterError
from .json_depth import DEFAULT_MAX_JSON_DEPTH, exceeds_depth

# safetensors dtype tag -> bytes per element, for the dtypes a LoRA adapter may use.
DTYPE_SIZES: dict[str, int] = {"F16": 2, "BF16": 2, "F32": 4}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets relative to the start of the data region
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    data_start: int  # 8 + header length: where the data region starts in the file
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_size: int  # bytes of tensor data after the header (what the tensors' offsets tile)


def _malformed(name: str, detail: str) -> AdapterError:
    return AdapterError(f"malformed safetensors file {name}: {detail}", code="malformed_safetensors")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _nonneg_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_safetensors_header(
    path: Path, max_header_bytes: int, *, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> SafetensorsHeader:
    """Parse and check the header of ``path``; raise AdapterError if anything is off."""
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _malformed(path.name, f"file is only {file_size} bytes, too short for a header")
        length = _header_length(path.name, prefix, max_header_bytes)
        if 8 + length > file_size:
            raise _malformed(path.name, f"header length {length} does not fit the {file_size}-byte file")
        raw = f.read(length)
    return parse_header(path.name, raw, file_size - 8 - length, max_json_depth)


def read_header_from_stream(
    src: BinaryIO, name: str, max_header_bytes: int, *, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> tuple[bytes, SafetensorsHeader]:
    """Read and check the 8-byte length and the JSON header from the start of a stream (an archive member
    being extracted), before any tensor data is read. Returns the bytes read and the header; the file is
    then exactly ``header.data_start + header.data_size`` bytes long."""
    prefix = _read_exactly(src, 8)
    if len(prefix) < 8:
        raise _malformed(name, f"file is only {len(prefix)} bytes, too short for a header")
    length = _header_length(name, prefix, max_header_bytes)
    raw = _read_exactly(src, length)
    if len(raw) < length:
        raise _malformed(name, f"header length {length} does not fit the {8 + len(raw)}-byte file")
    return prefix + raw, parse_header(name, raw, None, max_json_depth)


def _read_exactly(src: BinaryIO, size: int) -> bytes:
    parts, left = [], size
    while left > 0:
        chunk = src.read(min(left, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _header_length(name: str, prefix: bytes, max_header_bytes: int) -> int:
    length = int.from_bytes(prefix, "little")
    if length > max_header_bytes:
        raise _malformed(name, f"header is {length} bytes, over the limit of {max_header_bytes} bytes")
    if length < 2:
        raise _malformed(name, f"header length {length} is too short for a JSON object")
    return length


def parse_header(name: str, raw: bytes, data_size: int | None, max_json_depth: int) -> SafetensorsHeader:
    """Check the JSON header ``raw`` of file ``name``; its tensors must tile ``data_size`` bytes exactly
    (None: whatever size they tile, which becomes ``data_size``)."""
    if exceeds_depth(raw, max_json_depth):
        raise _malformed(name, f"header nests deeper than {max_json_depth} levels (the limit max_json_depth)")
    try:
        text = raw.decode("utf-8")
        if not text.lstrip().startswith("{"):
            raise ValueError("the header is not a JSON object")
        header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _malformed(name, f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _malformed(name, "header is not a JSON object")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _malformed(name, "__metadata__ must map strings to strings")

    tensors = {tensor: _entry(name, tensor, spec) for tensor, spec in header.items()}
    position = 0
    for entry in sorted(tensors.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin != position:
            problem = "overlaps another tensor" if entry.begin < position else "leaves a gap before it"
            raise _malformed(name, f"tensor {entry.name!r} {problem} (offset {entry.begin}, expected {position})")
        position = entry.end
    if data_size is not None and position != data_size:
        raise _malformed(name, f"tensor data covers {position} bytes but the file holds {data_size} data bytes")
    return SafetensorsHeader(data_start=8 + len(raw), tensors=tensors, metadata=dict(metadata), data_size=position)


def _entry(path: str, name: str, spec: Any) -> TensorEntry:
    if not name:
        raise _malformed(path, "a tensor has an empty name")
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise _malformed(path, f"tensor {name!r} needs exactly dtype, shape and data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise AdapterError(
            f"tensor {name!r} has dtype {dtype!r}; LoRA weights must be F16, BF16 or F32",
            code="unsupported_dtype",
        )
    if not isinstance(shape, list) or not all(_nonneg_int(d) for d in shape):
        raise _malformed(path, f"tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_nonneg_int(o) for o in offsets)):
        raise _malformed(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if end < begin or end - begin != expected:
        raise _malformed(path, f"tensor {name!r} spans {end - begin} bytes but {dtype} {shape} needs {expected}")
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)
