"""Adapter and batch-file blobs in S3-compatible object storage (`--blob-url s3://bucket/prefix`), for replicas
that share no filesystem. boto3 takes the endpoint URL and credentials from the environment (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION).

A blob is named by its content: `<first 40 hex of the sha256 over its files>-<random>` (the random part keeps
two uploads of the same files apart, so deleting one never removes the other's objects). `put` returns only
once every object is stored (S3 acknowledges a PUT when it is durable), so the caller registers the blob in SQL
after that; a failed `put` removes what it wrote. Readers go through a local read-through cache under the data
directory (the directory store's folder layout, keyed by that content-derived name): a missing copy is
downloaded into scratch, its files hashed and compared with the name, and only a verified copy is renamed into
the cache, so a corrupted or partial download is never served.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loraplex.platform.settings import parse_blob_url
from loraplex.platform.storage.blobstore import BlobMissing, BlobStore, _fsync_dir

_CHUNK = 1 << 20
_DIGEST_CHARS = 40


class BlobCorrupt(RuntimeError):
    """A downloaded blob's files do not hash to its name."""


def content_digest(files: Mapping[str, Path]) -> str:
    """sha256 over the sorted (file name, file sha256) pairs of a blob."""
    outer = hashlib.sha256()
    for name in sorted(files):
        inner = hashlib.sha256()
        with open(files[name], "rb") as f:
            while chunk := f.read(_CHUNK):
                inner.update(chunk)
        outer.update(f"{name}\0{inner.hexdigest()}\n".encode())
    return outer.hexdigest()


class S3BlobStore(BlobStore):
    def __init__(self, root: Path, url: str, client: Any = None) -> None:
        super().__init__(root)  # the local cache, scratch folders and their sweeping
        self.bucket, self.prefix = parse_blob_url(url)
        if client is None:
            import boto3

            client = boto3.client("s3")
        self.client = client

    def _key(self, blob: str, name: str = "") -> str:
        self.path(blob)  # validates the name
        return "/".join(p for p in (self.prefix, blob, name) if p)

    def put(self, files: Mapping[str, Path]) -> str:
        for name in files:
            if "/" in name or name.startswith("."):
                raise ValueError(f"invalid file name in blob: {name!r}")
        blob = f"{content_digest(files)[:_DIGEST_CHARS]}-{uuid.uuid4().hex[:16]}"
        written: list[str] = []
        try:
            for name, source in files.items():
                key = self._key(blob, name)
                self.client.upload_file(str(source), self.bucket, key)
                written.append(key)
            self._put_local(blob, files)  # this replica's cache, so its first reader does not download
        except BaseException:
            for key in written:
                self.client.delete_object(Bucket=self.bucket, Key=key)
            raise
        return blob

    def check(self) -> None:
        self.client.head_bucket(Bucket=self.bucket)

    def exists(self, blob: str) -> bool:
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(blob) + "/", MaxKeys=1)
        return bool(listed.get("KeyCount"))

    def fetch(self, blob: str) -> Path:
        local = self.path(blob)
        if local.is_dir():
            return local
        staging = self.scratch.mkdtemp(f"fetch-{blob}-")
        try:
            files = self._download(blob, staging)
            if content_digest(files)[:_DIGEST_CHARS] != blob[:_DIGEST_CHARS]:
                raise BlobCorrupt(f"blob {blob} from s3://{self.bucket}/{self.prefix} does not match its content hash")
            _fsync_dir(staging)
            try:
                staging.rename(local)
            except OSError:  # another reader put it there first
                if not local.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return local

    def _download(self, blob: str, into: Path) -> dict[str, Path]:
        prefix = self._key(blob) + "/"
        files: dict[str, Path] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                name = item["Key"][len(prefix) :]
                if not name or "/" in name or name.startswith("."):
                    raise BlobCorrupt(f"unexpected object {item['Key']!r} in blob {blob}")
                self.client.download_file(self.bucket, item["Key"], str(into / name))
                files[name] = into / name
        if not files:
            raise BlobMissing(blob, f"s3://{self.bucket}/{self.prefix}")
        return files

    def delete(self, blob: str) -> None:
        prefix = self._key(blob) + "/"
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                self.client.delete_object(Bucket=self.bucket, Key=item["Key"])
        self.evict(blob)

    def evict(self, blob: str) -> None:
        super().delete(blob)  # the local copy only
