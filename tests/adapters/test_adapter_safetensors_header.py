"""The safetensors header is parsed and checked by us before safetensors ever opens the file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from loraplex.adapters import AdapterError, AdapterLimits, load_adapter
from loraplex.adapters.safetensors_header import read_safetensors_header

WEIGHTS = "adapter_model.safetensors"


def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _rewrite(path: Path, header: bytes, data: bytes, length: int | None = None) -> None:
    path.write_bytes((len(header) if length is None else length).to_bytes(8, "little") + header + data)


def _edit_header(path: Path, fn: Callable[[dict], None]) -> None:
    header, data = _split(path)
    fn(header)
    _rewrite(path, json.dumps(header).encode(), data)


def _first(header: dict) -> dict:
    return header[sorted(k for k in header if k != "__metadata__")[0]]


def _malformed(folder: Path, base, *fragments: str, limits: AdapterLimits = AdapterLimits()) -> None:
    with pytest.raises(AdapterError) as info:
        load_adapter(folder, base, max_lora_rank=8, limits=limits)
    assert info.value.code == "malformed_safetensors", str(info.value)
    assert "malformed safetensors file" in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_valid_header_is_read(adapter_dir: Path) -> None:
    header = read_safetensors_header(adapter_dir / WEIGHTS, 1 << 20)
    assert len(header.tensors) == 42
    entry = header.tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert entry.dtype == "F32" and entry.shape == (4, 48) and entry.end - entry.begin == 4 * 48 * 4


def test_header_length_over_the_limit(adapter_dir: Path, base) -> None:
    header, _ = _split(adapter_dir / WEIGHTS)
    size = len(json.dumps(header))
    _malformed(adapter_dir, base, "over the limit", limits=AdapterLimits(max_safetensors_header_bytes=size // 2))


def test_header_length_past_the_end_of_the_file(adapter_dir: Path, base) -> None:
    header, data = _split(adapter_dir / WEIGHTS)
    body = json.dumps(header).encode()
    _rewrite(adapter_dir / WEIGHTS, body, data[:10], length=len(body) + 100)
    _malformed(adapter_dir, base, "does not fit")


def test_huge_declared_header_length(adapter_dir: Path, base) -> None:
    _rewrite(adapter_dir / WEIGHTS, b"{}", b"", length=2**63)
    _malformed(adapter_dir, base, "over the limit")


def test_file_too_short(adapter_dir: Path, base) -> None:
    (adapter_dir / WEIGHTS).write_bytes(b"\x01\x02")
    _malformed(adapter_dir, base, "too short")


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"\x80\x04\x95 pickle?", "not valid JSON"),
        (b"[1, 2, 3]", "not valid JSON"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}}', "duplicate key"),
        (b'{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}', "not valid JSON"),
        (b'{"a": {"dtype": "F32", "shape": [1]}}', "needs exactly dtype, shape and data_offsets"),
        (b'{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', "invalid shape"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4]}}', "invalid data_offsets"),
        (b'{"__metadata__": {"x": 1}}', "__metadata__"),
    ],
)
def test_malformed_json_headers(adapter_dir: Path, base, body: bytes, fragment: str) -> None:
    _rewrite(adapter_dir / WEIGHTS, body, b"\x00" * 4)
    _malformed(adapter_dir, base, fragment)


def test_offsets_beyond_the_file(adapter_dir: Path, base) -> None:
    def stretch(header: dict) -> None:
        last = max((v for k, v in header.items() if k != "__metadata__"), key=lambda v: v["data_offsets"][1])
        last["shape"][0] += 1  # one more row than the file holds (float32)
        last["data_offsets"][1] += 4 * last["shape"][1]

    _edit_header(adapter_dir / WEIGHTS, stretch)
    _malformed(adapter_dir, base, "covers")


def test_offsets_that_do_not_match_the_shape(adapter_dir: Path, base) -> None:
    _edit_header(adapter_dir / WEIGHTS, lambda h: _first(h).update(shape=[999, 999]))
    _malformed(adapter_dir, base, "needs")


def test_overlapping_offsets(adapter_dir: Path, base) -> None:
    def overlap(header: dict) -> None:
        entries = sorted((v for k, v in header.items() if k != "__metadata__"), key=lambda v: v["data_offsets"][0])
        entries[1]["data_offsets"] = list(entries[0]["data_offsets"])
        entries[1]["shape"] = list(entries[0]["shape"])

    _edit_header(adapter_dir / WEIGHTS, overlap)
    _malformed(adapter_dir, base, "overlaps")


def test_trailing_bytes_after_the_data(adapter_dir: Path, base) -> None:
    with open(adapter_dir / WEIGHTS, "ab") as f:
        f.write(b"\x00" * 16)
    _malformed(adapter_dir, base, "covers")
