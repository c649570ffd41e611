"""Zip bombs for the upload tests: a real .zip whose member inflates to ``size`` bytes (``head`` then zeros)
from a ~1000x smaller archive, built in about a second (deflate is run on one zero chunk only: after a
full flush the compressor starts afresh, so that chunk's output repeats byte for byte)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

_CHUNK = 1 << 24


def _deflate_zeros(head: bytes, size: int) -> tuple[bytes, int]:
    """Raw deflate data of ``head`` + zeros up to ``size`` bytes, and its CRC-32."""
    assert (size - len(head)) % _CHUNK == 0, "the zeros must be a whole number of 16 MiB chunks"
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [comp.compress(head) + comp.flush(zlib.Z_FULL_FLUSH)]
    zeros = bytes(_CHUNK)
    block = comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH)
    assert comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH) == block  # the chunk's output repeats
    count = (size - len(head)) // _CHUNK
    parts += [block] * count + [comp.flush()]
    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(zeros, crc)
    return b"".join(parts), crc


def write_zip_bomb(path: Path, name: str, head: bytes, size: int, others: dict[str, bytes] | None = None) -> Path:
    """A .zip holding ``others`` (stored) and the member ``name`` = ``head`` + zeros, ``size`` bytes inflated."""
    members = [(n, data, zlib.crc32(data), len(data), 0) for n, data in (others or {}).items()]
    data, crc = _deflate_zeros(head, size)
    members.append((name, data, crc, size, 8))
    out, central = bytearray(), bytearray()
    for member, payload, member_crc, usize, method in members:
        raw = member.encode()
        offset = len(out)
        out += struct.pack(
            "<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, member_crc, len(payload), usize, len(raw), 0
        )
        out += raw + payload
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII",
            0x02014B50,
            20,
            20,
            0,
            method,
            0,
            0x21,
            member_crc,
            len(payload),
            usize,
            len(raw),
            0,
            0,
            0,
            0,
            0,
            offset,
        )
        central += raw
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(out), 0)
    path.write_bytes(bytes(out))
    return path
