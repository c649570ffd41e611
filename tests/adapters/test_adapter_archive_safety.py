"""extract_archive refuses members that could escape the folder and archives over the limits."""

from __future__ import annotations

import io
import stat
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

from loraplex.adapters import AdapterError, AdapterLimits, extract_archive, load_adapter

SMALL = AdapterLimits(max_archive_bytes=1 << 20, max_unpacked_bytes=1 << 20, max_members=8)


def _zip(path: Path, members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in members:
            zf.writestr(info, data)
    return path


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], fmt: int = tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, "w:gz", format=fmt) as tf:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _tarinfo(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


def _refused(archive: Path, tmp_path: Path, code: str, *fragments: str, limits: AdapterLimits = SMALL) -> None:
    dest = tmp_path / f"dest-{archive.name}"
    with pytest.raises(AdapterError) as info:
        extract_archive(archive, dest, limits)
    assert info.value.code == code, str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert not dest.exists() or list(dest.iterdir()) == [], "a refused archive left files behind"
    assert not any(p.name == "evil" for p in tmp_path.parent.rglob("*")), "a member escaped the extraction folder"


# --- names that escape ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("../evil", "escapes the extraction folder"),
        ("ok/../../evil", "escapes the extraction folder"),
        ("/tmp/evil", "absolute path"),
        ("C:/evil", "absolute path"),
        ("a\\..\\evil", "unsafe name"),
    ],
)
def test_zip_member_names_that_escape(tmp_path: Path, name: str, fragment: str) -> None:
    _refused(
        _zip(tmp_path / "a.zip", [("adapter_config.json", b"{}"), (zipfile.ZipInfo(name), b"x")]),
        tmp_path,
        "unsafe_archive",
        fragment,
    )


@pytest.mark.parametrize("name", ["../evil", "/tmp/evil", "x/../../evil"])
def test_tar_member_names_that_escape(tmp_path: Path, name: str) -> None:
    _refused(_tar(tmp_path / "a.tar.gz", [(_tarinfo(name), b"x")]), tmp_path, "unsafe_archive", repr(name))


# --- links, devices ---------------------------------------------------------------------------


def test_zip_symlink_member(tmp_path: Path) -> None:
    link = zipfile.ZipInfo("adapter_model.safetensors")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    _refused(_zip(tmp_path / "a.zip", [(link, b"/etc/passwd")]), tmp_path, "unsafe_archive", "symbolic link")


@pytest.mark.parametrize(
    "kind, fragment",
    [
        (tarfile.SYMTYPE, "symbolic link"),
        (tarfile.LNKTYPE, "hard link"),
        (tarfile.CHRTYPE, "device file"),
        (tarfile.BLKTYPE, "device file"),
        (tarfile.FIFOTYPE, "FIFO"),
    ],
)
def test_tar_links_and_devices(tmp_path: Path, kind: bytes, fragment: str) -> None:
    archive = _tar(tmp_path / "a.tgz", [(_tarinfo("adapter_model.safetensors", kind, "/etc/passwd"), b"")])
    _refused(archive, tmp_path, "unsafe_archive", fragment)


def test_tar_symlink_then_write_through_it(tmp_path: Path) -> None:
    members = [(_tarinfo("sub", tarfile.SYMTYPE, str(tmp_path)), b""), (_tarinfo("sub/evil"), b"x")]
    _refused(_tar(tmp_path / "a.tar.gz", members), tmp_path, "unsafe_archive", "symbolic link")


def test_duplicate_and_file_as_folder_members(tmp_path: Path) -> None:
    with pytest.warns(UserWarning):  # zipfile warns about the duplicate name while writing it
        dup = _zip(tmp_path / "dup.zip", [("adapter_config.json", b"{}"), ("adapter_config.json", b"{}")])
    _refused(dup, tmp_path, "unsafe_archive", "appears twice")
    nested = _zip(tmp_path / "nested.zip", [("a", b"file"), ("a/b", b"x")])
    _refused(nested, tmp_path, "unsafe_archive", "inside a file")


# --- sizes ------------------------------------------------------------------------------------


def test_zip_bomb_is_stopped_by_declared_size(tmp_path: Path) -> None:
    bomb = _zip(tmp_path / "bomb.zip", [("adapter_config.json", b"{}"), ("adapter_model.safetensors", bytes(8 << 20))])
    assert bomb.stat().st_size < 64 << 10
    _refused(bomb, tmp_path, "archive_too_large", "declares more than")


def test_tar_gz_bomb_is_stopped_by_declared_size(tmp_path: Path) -> None:
    bomb = _tar(tmp_path / "bomb.tar.gz", [(_tarinfo("adapter_model.safetensors"), bytes(8 << 20))])
    assert bomb.stat().st_size < 64 << 10
    _refused(bomb, tmp_path, "archive_too_large", "declares more than")


def test_tar_gz_bomb_in_headers_is_stopped_by_actual_size(tmp_path: Path) -> None:
    info = _tarinfo("adapter_config.json")
    info.pax_headers = {"comment": "x" * (4 << 20)}  # 4 MiB pax record: no member data declared at all
    bomb = _tar(tmp_path / "pax.tar.gz", [(info, b"{}")])
    _refused(bomb, tmp_path, "archive_too_large", "decompresses to more data")


def test_zip_member_larger_than_declared_is_refused(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "lie.zip", [("adapter_model.safetensors", b"A" * 5000)])
    raw = bytearray(archive.read_bytes())
    # Patch the uncompressed size (local header at offset 22, central directory entry at +24) to 100.
    struct.pack_into("<I", raw, 22, 100)
    central = raw.rfind(b"PK\x01\x02")
    struct.pack_into("<I", raw, central + 24, 100)
    archive.write_bytes(bytes(raw))
    with pytest.raises(AdapterError) as info:
        extract_archive(archive, tmp_path / "dest", SMALL)
    assert info.value.code == "corrupt_archive" and "Bad CRC" in str(info.value)


def test_too_many_members(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "many.zip", [(f"f{i}.txt", b"x") for i in range(9)])
    _refused(archive, tmp_path, "archive_too_large", "9 members", "limit of 8")
    tgz = _tar(tmp_path / "many.tgz", [(_tarinfo(f"f{i}.txt"), b"x") for i in range(9)])
    _refused(tgz, tmp_path, "archive_too_large", "more than 8 members")


def test_archive_file_over_the_limit(adapter_dir: Path, tmp_path: Path, zip_folder, base) -> None:
    archive = zip_folder(adapter_dir, tmp_path / "a.zip")
    limits = AdapterLimits(max_archive_bytes=1000)
    _refused(archive, tmp_path, "archive_too_large", "over the limit of 1000 bytes", limits=limits)
    with pytest.raises(AdapterError, match="over the limit of 1000 bytes"):
        load_adapter(archive, base, max_lora_rank=8, limits=limits)


# --- not archives -----------------------------------------------------------------------------


def test_not_an_archive_and_corrupt_archives(tmp_path: Path) -> None:
    text = tmp_path / "notes.rar"
    text.write_text("hello")
    _refused(text, tmp_path, "unsupported_archive", "not a supported archive")
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04garbage")
    _refused(broken, tmp_path, "corrupt_archive", "corrupt zip archive")
    truncated = tmp_path / "t.tar.gz"
    truncated.write_bytes(_tar(tmp_path / "ok.tar.gz", [(_tarinfo("f"), b"x" * 3000)]).read_bytes()[:40])
    _refused(truncated, tmp_path, "corrupt_archive", "corrupt tar.gz archive")


def test_more_than_one_top_level_folder(adapter_dir: Path, tmp_path: Path) -> None:
    config = (adapter_dir / "adapter_config.json").read_bytes()
    archive = _zip(tmp_path / "two.zip", [("a/adapter_config.json", config), ("b/adapter_config.json", config)])
    _refused(archive, tmp_path, "missing_file", "inside a single folder")


def test_macos_metadata_folder_is_ignored(adapter_dir: Path, tmp_path: Path) -> None:
    members = [(f"adapter/{p.name}", p.read_bytes()) for p in adapter_dir.iterdir()]
    members.append(("__MACOSX/adapter/._adapter_config.json", b"\x00\x05\x16\x07"))
    root = extract_archive(_zip(tmp_path / "mac.zip", members), tmp_path / "dest", AdapterLimits())
    assert root == tmp_path / "dest" / "adapter"
