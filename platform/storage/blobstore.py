"""Adapter blob store: one folder per stored adapter version under `<data_dir>/adapters/blobs/`.

Writes are atomic: files are copied into a temporary folder on the same filesystem, each file and
the folder are fsynced, and the folder is renamed into place (then the parent is fsynced). A reader
therefore sees either nothing or the complete adapter. Several replicas may share the folder (e.g. over
NFS). Every temporary file (uploads in progress, staged blobs, blobs being deleted) lives in this
process's own folder under `tmp/` (`loraplex.scratch`), so a crash leaves only that folder, which
the next process to open the store removes at once, while live replicas' folders stay.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from loraplex.scratch import ProcessScratch, process_scratch, sweep

_CHUNK = 1 << 20
_LEGACY_PREFIXES = ("upload-", "blob-", "deleted-")


class BlobMissing(FileNotFoundError):
    """A blob that the database names is gone from the store (deleted behind our back); platform/faults.py answers
    it with a named code."""

    def __init__(self, blob: str, where: str) -> None:
        super().__init__(f"stored files {blob} are missing from {where}")
        self.blob = blob


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.tmp = self.root / "tmp"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.scratch: ProcessScratch = process_scratch(self.tmp)  # sweeps dead processes' folders

    def path(self, blob: str) -> Path:
        if not blob or "/" in blob or blob.startswith("."):
            raise ValueError(f"invalid blob name {blob!r}")
        return self.blobs / blob

    def exists(self, blob: str) -> bool:
        return self.path(blob).is_dir()

    def check(self) -> None:
        """Raise if the store cannot be reached (readiness). Blocking."""
        if not self.blobs.is_dir():
            raise FileNotFoundError(f"the blob folder {self.blobs} is gone")

    def fetch(self, blob: str) -> Path:
        """The blob's local folder, ready to read (here it is the store itself; see S3BlobStore). Blocking;
        BlobMissing if it is gone."""
        path = self.path(blob)
        if not path.is_dir():
            raise BlobMissing(blob, "the data directory's blob store")
        return path

    def evict(self, blob: str) -> None:
        """Drop a local copy of a blob deleted elsewhere (nothing to do: the folder is the store)."""

    def new_tmp_dir(self) -> Path:
        """A private scratch folder for an upload in progress (caller removes it)."""
        return self.scratch.mkdtemp("upload-")

    def put(self, files: Mapping[str, Path]) -> str:
        """Store `files` (name in the blob -> source file) atomically; return the new blob's name."""
        blob = uuid.uuid4().hex
        self._put_local(blob, files)
        return blob

    def _put_local(self, blob: str, files: Mapping[str, Path]) -> None:
        staging = self.scratch.mkdtemp(f"blob-{blob}-")
        try:
            for name, source in files.items():
                if "/" in name or name.startswith("."):
                    raise ValueError(f"invalid file name in blob: {name!r}")
                _copy_synced(Path(source), staging / name)
            _fsync_dir(staging)
            os.rename(staging, self.path(blob))
            _fsync_dir(self.blobs)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def delete(self, blob: str) -> None:
        """Remove a blob; it is renamed away first so readers never see a half-deleted folder."""
        path = self.path(blob)
        if not path.exists():
            return
        doomed = self.scratch.path / f"deleted-{blob}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    def sweep_tmp(self, older_than_s: float = 3600.0) -> None:
        """Remove dead processes' scratch folders now, and old leftovers of versions before process folders
        (`upload-*`, `blob-*`, `deleted-*` directly under tmp/): only old ones, since replicas of such a
        version sharing the store may be writing theirs right now."""
        sweep(self.tmp, skip=self.scratch.owner)
        cutoff = time.time() - older_than_s
        for child in self.tmp.iterdir():
            if not child.name.startswith(_LEGACY_PREFIXES):
                continue
            try:
                if child.stat().st_mtime < cutoff:
                    shutil.rmtree(child, ignore_errors=True)
            except FileNotFoundError:
                continue


def _copy_synced(source: Path, target: Path) -> None:
    with open(source, "rb") as src, open(target, "xb") as dst:
        while chunk := src.read(_CHUNK):
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
