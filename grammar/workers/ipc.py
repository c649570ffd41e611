"""Length-prefixed pickle frames over pipes, with deadlines on the reading side."""

from __future__ import annotations

import os
import pickle
import select
import struct
import time
from typing import Any

_HEADER = struct.Struct("<Q")


class PipeClosed(Exception):
    """The other side went away (EOF or broken pipe)."""


class Deadline(Exception):
    """No complete frame arrived before the deadline."""


def write_frame(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except (BrokenPipeError, OSError) as e:
        raise PipeClosed(str(e)) from None


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise Deadline()
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise PipeClosed("end of stream")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> Any:
    """Next object from `fd`; Deadline if `deadline` (time.monotonic) passes first."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))
