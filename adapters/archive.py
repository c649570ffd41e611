"""Safe extraction of uploaded adapter archives (.zip, .tar.gz / .tgz).

Nothing is handed to ``extractall``: every member is checked (name stays inside the destination,
regular file or folder only, member count, declared sizes) and then copied by us in chunks while
the bytes actually written are counted, so a lying header or a decompression bomb stops early.

The weights file is validated while it streams: its safetensors header (8-byte length + JSON) is read
and checked before a byte of it is written, and the member must then be exactly as long as the
header's tensors say, so an archive cannot unpack to more than its header promises. adapter_config.json
is held to ``max_config_bytes``, and every other member (README, tokenizer files, never used) shares
``max_extra_bytes``; pickled files are refused by name before they are unpacked.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from .errors import AdapterError
from .files import CONFIG_NAME, PICKLE_SUFFIXES, WEIGHTS_NAME, pickled_error
from .limits import AdapterLimits
from .safetensors_header import read_header_from_stream

_CHUNK = 1 << 20
# Tar headers, pax records and padding that may be decompressed on top of the members' data.
_TAR_OVERHEAD_PER_MEMBER = 4096
_IGNORED_TOP_LEVEL = {"__MACOSX", ".DS_Store"}


def archive_kind(path: Path) -> str | None:
    """``"zip"``, ``"tar.gz"`` or None, from the file name and, failing that, its magic bytes."""
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith((".tar.gz", ".tgz")):
        return "tar.gz"
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return None
    if magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if magic.startswith(b"\x1f\x8b"):
        return "tar.gz"
    return None


def extract_archive(archive: Path, dest: Path, limits: AdapterLimits) -> Path:
    """Extract ``archive`` into the empty folder ``dest`` and return the folder holding the adapter.

    On refusal ``dest`` is emptied again.

    The adapter files must sit at the archive's top level or inside a single top-level folder.
    Raises AdapterError for unsafe members (``..``, absolute paths, links, devices), archives over the
    size / member limits, corrupt archives, and archives without ``adapter_config.json``.
    """
    archive, dest = Path(archive), Path(dest)
    kind = archive_kind(archive)
    if kind is None:
        raise AdapterError(
            f"{archive.name!r} is not a supported archive; upload a .zip, .tar.gz or .tgz file",
            code="unsupported_archive",
        )
    size = archive.stat().st_size
    if size > limits.max_archive_bytes:
        raise AdapterError(
            f"archive is {size} bytes, over the limit of {limits.max_archive_bytes} bytes",
            code="archive_too_large",
        )
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"extraction folder {dest} is not empty")
    writer = _MemberWriter(dest, limits)
    try:
        try:
            if kind == "zip":
                _extract_zip(archive, writer)
            else:
                _extract_tar_gz(archive, writer, limits)
        except (zipfile.BadZipFile, tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
            raise AdapterError(f"corrupt {kind} archive: {exc}", code="corrupt_archive") from exc
        return find_adapter_root(dest)
    except AdapterError:
        _empty(dest)  # leave no half-extracted upload behind
        raise


def _empty(folder: Path) -> None:
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def find_adapter_root(dest: Path) -> Path:
    """The folder under ``dest`` that holds adapter_config.json: ``dest`` itself or its one subfolder."""
    if (dest / CONFIG_NAME).is_file():
        return dest
    entries = [p for p in dest.iterdir() if p.name not in _IGNORED_TOP_LEVEL]
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / CONFIG_NAME).is_file():
        return entries[0]
    raise AdapterError(
        f"missing {CONFIG_NAME}: the archive must hold the adapter files at its top level or inside a single folder",
        code="missing_file",
    )


def safe_member_path(name: str) -> PurePosixPath:
    """The member's path relative to the extraction folder, or AdapterError if it could escape it."""
    if not name or "\x00" in name or "\\" in name:
        raise AdapterError(f"archive member {name!r} has an unsafe name", code="unsafe_archive")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise AdapterError(f"archive member {name!r} has an absolute path", code="unsafe_archive")
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if ".." in parts:
        raise AdapterError(f"archive member {name!r} escapes the extraction folder (..)", code="unsafe_archive")
    if not parts:
        raise AdapterError(f"archive member {name!r} has an empty path", code="unsafe_archive")
    return PurePosixPath(*parts)


class _MemberWriter:
    """Creates folders and files under ``dest``, enforcing the member and byte limits."""

    def __init__(self, dest: Path, limits: AdapterLimits) -> None:
        self.dest = dest
        self.limits = limits
        self.members = 0
        self.declared = 0
        self.written = 0
        self.extra = 0  # declared bytes of members other than the adapter's two files

    def count(self, name: str, declared_size: int) -> PurePosixPath:
        self.members += 1
        if self.members > self.limits.max_members:
            raise AdapterError(f"archive has more than {self.limits.max_members} members", code="archive_too_large")
        if declared_size < 0:
            raise AdapterError(f"archive member {name!r} declares a negative size", code="corrupt_archive")
        self.declared += declared_size
        if self.declared > self.limits.max_unpacked_bytes:
            raise AdapterError(
                f"archive declares more than {self.limits.max_unpacked_bytes} unpacked bytes",
                code="archive_too_large",
            )
        return safe_member_path(name)

    def make_dir(self, rel: PurePosixPath) -> None:
        self._parent_dirs(rel)
        target = self.dest.joinpath(*rel.parts)
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise AdapterError(f"archive member {str(rel)!r} appears twice", code="unsafe_archive")
        target.mkdir(exist_ok=True)

    def write_file(self, rel: PurePosixPath, src: BinaryIO, declared_size: int) -> None:
        self._check_kind(rel, declared_size)
        head = b""
        if _is_adapter_file(rel, WEIGHTS_NAME):
            head, header = read_header_from_stream(
                src,
                str(rel),
                self.limits.max_safetensors_header_bytes,
                max_json_depth=self.limits.max_json_depth,
            )
            promised = header.data_start + header.data_size
            if promised != declared_size:
                raise AdapterError(
                    f"malformed safetensors file {rel!s}: its header describes {promised} bytes "
                    f"but the archive member holds {declared_size}",
                    code="malformed_safetensors",
                )
        self._parent_dirs(rel)
        target = self.dest.joinpath(*rel.parts)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(target, flags, 0o600)
        except FileExistsError:
            raise AdapterError(f"archive member {str(rel)!r} appears twice", code="unsafe_archive") from None
        actual = 0
        with os.fdopen(fd, "wb") as out:
            chunk = head
            while chunk or (chunk := src.read(_CHUNK)):
                actual += len(chunk)
                self.written += len(chunk)
                if actual > declared_size:
                    raise AdapterError(
                        f"archive member {str(rel)!r} unpacks to more than its declared {declared_size} bytes",
                        code="archive_too_large",
                    )
                if self.written > self.limits.max_unpacked_bytes:
                    raise AdapterError(
                        f"archive unpacks to more than {self.limits.max_unpacked_bytes} bytes",
                        code="archive_too_large",
                    )
                out.write(chunk)
                chunk = b""
        if actual != declared_size:
            raise AdapterError(
                f"archive member {str(rel)!r} is truncated ({actual} of {declared_size} bytes)",
                code="corrupt_archive",
            )

    def _check_kind(self, rel: PurePosixPath, declared_size: int) -> None:
        """Refuse pickles by name, an oversized config, and other members over their shared budget."""
        if rel.name.lower().endswith(PICKLE_SUFFIXES):
            raise pickled_error(str(rel))
        if _is_adapter_file(rel, CONFIG_NAME):
            if declared_size > self.limits.max_config_bytes:
                raise AdapterError(
                    f"{CONFIG_NAME} is {declared_size} bytes, over the limit of {self.limits.max_config_bytes} bytes",
                    code="invalid_config",
                )
        elif not _is_adapter_file(rel, WEIGHTS_NAME):
            self.extra += declared_size
            if self.extra > self.limits.max_extra_bytes:
                raise AdapterError(
                    f"archive members other than {CONFIG_NAME} and {WEIGHTS_NAME} (such as {str(rel)!r}) hold "
                    f"more than {self.limits.max_extra_bytes} bytes (the limit max_extra_bytes); they are never "
                    "used: leave them out of the archive",
                    code="archive_too_large",
                )

    def _parent_dirs(self, rel: PurePosixPath) -> None:
        current = self.dest
        for part in rel.parts[:-1]:
            current = current / part
            if current.is_symlink() or (current.exists() and not current.is_dir()):
                raise AdapterError(f"archive member {str(rel)!r} is inside a file", code="unsafe_archive")
            current.mkdir(exist_ok=True)


def _is_adapter_file(rel: PurePosixPath, name: str) -> bool:
    """Whether ``rel`` is the adapter file ``name`` (at the top level or inside one folder)."""
    return rel.name == name and len(rel.parts) <= 2


def _extract_zip(archive: Path, writer: _MemberWriter) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > writer.limits.max_members:
            raise AdapterError(
                f"archive has {len(infos)} members, over the limit of {writer.limits.max_members}",
                code="archive_too_large",
            )
        for info in infos:
            rel = writer.count(info.filename, info.file_size)
            mode = info.external_attr >> 16
            kind = stat.S_IFMT(mode)
            if info.create_system == 3 and kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                what = "a symbolic link" if kind == stat.S_IFLNK else "not a regular file"
                raise AdapterError(f"archive member {info.filename!r} is {what}", code="unsafe_archive")
            if info.flag_bits & 0x1:
                raise AdapterError(f"archive member {info.filename!r} is encrypted", code="unsafe_archive")
            if info.is_dir() or kind == stat.S_IFDIR:
                writer.make_dir(rel)
                continue
            with zf.open(info) as src:
                writer.write_file(rel, src, info.file_size)


def _extract_tar_gz(archive: Path, writer: _MemberWriter, limits: AdapterLimits) -> None:
    budget = limits.max_unpacked_bytes + _TAR_OVERHEAD_PER_MEMBER * (limits.max_members + 2)
    with open(archive, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
        stream = _BoundedReader(gz, budget)
        # Stream mode ("r|"): members are read strictly in order, nothing seeks or reads ahead.
        with tarfile.open(fileobj=stream, mode="r|") as tf:
            for member in tf:
                _check_tar_member_type(member)
                rel = writer.count(member.name, member.size)
                if member.isdir():
                    writer.make_dir(rel)
                    continue
                src = tf.extractfile(member)
                if src is None:  # pragma: no cover - isreg() members always have data
                    raise AdapterError(f"archive member {member.name!r} has no data", code="corrupt_archive")
                writer.write_file(rel, src, member.size)


def _check_tar_member_type(member: tarfile.TarInfo) -> None:
    if member.issym():
        what = "a symbolic link"
    elif member.islnk():
        what = "a hard link"
    elif member.ischr() or member.isblk():
        what = "a device file"
    elif member.isfifo():
        what = "a FIFO"
    elif member.issparse():
        what = "a sparse file"
    elif member.isreg() or member.isdir():
        return
    else:
        what = "not a regular file"
    raise AdapterError(f"archive member {member.name!r} is {what}", code="unsafe_archive")


class _BoundedReader(io.RawIOBase):
    """A read-only stream that refuses to hand out more than ``budget`` decompressed bytes."""

    def __init__(self, inner: BinaryIO, budget: int) -> None:
        self._inner = inner
        self._left = budget

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        want = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
        data = self._inner.read(want)
        self._left -= len(data)
        if self._left < 0:
            raise AdapterError("archive decompresses to more data than its size limits allow", code="archive_too_large")
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]  # (io's is WriteableBuffer)
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
