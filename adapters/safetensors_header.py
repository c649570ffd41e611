"""Validation of a .safetensors file's header, done by us before safetensors sees the file.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the tensor data. Every tensor's
``data_offsets`` are relative to the data start; together they must tile the data region exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import AdapterError

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


def _malformed(path: Path, detail: str) -> AdapterError:
    return AdapterError(f"malformed safetensors file {path.name}: {detail}", code="malformed_safetensors")


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


def read_safetensors_header(path: Path, max_header_bytes: int) -> SafetensorsHeader:
    """Parse and check the header of ``path``; raise AdapterError if anything is off."""
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _malformed(path, f"file is only {file_size} bytes, too short for a header")
        length = int.from_bytes(prefix, "little")
        if length > max_header_bytes:
            raise _malformed(path, f"header is {length} bytes, over the limit of {max_header_bytes} bytes")
        if length < 2 or 8 + length > file_size:
            raise _malformed(path, f"header length {length} does not fit the {file_size}-byte file")
        raw = f.read(length)
    try:
        text = raw.decode("utf-8")
        if not text.lstrip().startswith("{"):
            raise ValueError("the header is not a JSON object")
        header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _malformed(path, f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _malformed(path, "header is not a JSON object")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _malformed(path, "__metadata__ must map strings to strings")

    data_size = file_size - 8 - length
    tensors = {name: _entry(path, name, spec) for name, spec in header.items()}
    position = 0
    for entry in sorted(tensors.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin != position:
            problem = "overlaps another tensor" if entry.begin < position else "leaves a gap before it"
            raise _malformed(path, f"tensor {entry.name!r} {problem} (offset {entry.begin}, expected {position})")
        position = entry.end
    if position != data_size:
        raise _malformed(path, f"tensor data covers {position} bytes but the file holds {data_size} data bytes")
    return SafetensorsHeader(data_start=8 + length, tensors=tensors, metadata=dict(metadata))


def _entry(path: Path, name: str, spec: Any) -> TensorEntry:
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
