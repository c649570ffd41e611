"""What an import's `source` names and how each kind is fetched into a folder that the upload checks then read:
s3://bucket/prefix (the folder's two files, or one archive; the tenant's keys or the server's own chain),
https://.../adapter.zip|.tar.gz (one archive whose sha256 the tenant states), hf://org/repo[@revision] (the
Hub's file API at HF_ENDPOINT: the revision resolved to a commit first, the files read at that commit).

Every byte comes through `Fetcher` (the address policy, the streaming byte budget); S3 requests are signed with
botocore's SigV4 (no network) and sent through it too, so no connection bypasses the policy."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from loraplex.adapters import CONFIG_NAME, WEIGHTS_NAME, AdapterError, AdapterLimits, extract_archive
from loraplex.platform.adapters.imports.fetch import Budget, Downloaded, Fetcher, SourceError, shown
from loraplex.platform.domain_errors import Invalid

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
HUB = "https://huggingface.co"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
REVISION_RE = re.compile(r"^[A-Za-z0-9._/-]{1,200}$")


@dataclass(frozen=True)
class Source:
    """A parsed reference: `kind` (s3, https, hf) and its parts; `text` is what the tenant sent."""

    kind: str
    text: str
    bucket: str = ""
    key: str = ""
    url: str = ""
    repo: str = ""
    revision: str = ""

    @property
    def shown(self) -> str:
        """The reference as responses, logs and the version's origin show it (no query: no credentials)."""
        return shown(self.url) if self.kind == "https" else self.text


def _bad(message: str) -> Invalid:
    return Invalid(message, param="source", code="invalid_source")


def parse_source(text: str, sha256: str | None) -> Source:
    """The reference checked for its shape (a 400 naming what is wrong); addresses are checked when fetched."""
    if not isinstance(text, str) or not text or len(text) > 2048:
        raise _bad("source must be a reference of at most 2048 characters: s3://, https:// or hf://")
    if sha256 is not None and not SHA256_RE.match(sha256):
        raise Invalid("sha256 must be 64 lowercase hexadecimal digits", param="sha256", code="invalid_source")
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme == "s3":
        bucket, _, key = text[len("s3://") :].partition("/")
        if not BUCKET_RE.match(bucket) or ".." in bucket:
            raise _bad(f"s3 source: {bucket!r} is not a valid bucket name")
        if ".." in key.split("/") or "\\" in key:
            raise _bad("s3 source: the prefix may not contain '..' segments")
        return Source("s3", text, bucket=bucket, key=key.strip("/"))
    if scheme in ("https", "http"):
        parts = urlsplit(text)
        if parts.username is not None or parts.password is not None:
            raise _bad("https source: credentials in the URL are refused (they would be stored and shown)")
        if not parts.hostname:
            raise _bad("https source: the URL has no host")
        if not parts.path.lower().endswith(ARCHIVE_SUFFIXES):
            raise _bad("https source: the URL must name a .zip or .tar.gz archive of the adapter folder")
        if sha256 is None:
            raise Invalid(
                "an https source needs 'sha256' (the archive's SHA-256, checked before anything is stored)",
                param="sha256",
                code="invalid_source",
            )
        return Source("https", text, url=text)
    if scheme == "hf":
        repo, _, revision = text[len("hf://") :].partition("@")
        if not REPO_RE.match(repo) or ".." in repo:
            raise _bad(f"hf source: {repo!r} is not an org/repo name")
        revision = revision or "main"
        if not REVISION_RE.match(revision) or ".." in revision:
            raise _bad(f"hf source: {revision!r} is not a revision (a branch, tag or commit)")
        return Source("hf", text, repo=repo, revision=revision)
    raise _bad("source must start with s3://, https:// or hf://")


@dataclass(frozen=True)
class Fetched:
    """A source in a local folder: the adapter's folder, what a moving reference resolved to, and the sha256 of the
    archive (https, an s3 archive) or of the weights file (hf, an s3 folder)."""

    root: Path
    resolved: str | None
    sha256: str


FileProgress = Callable[[int, int | None], None]


class Progress:
    """Bytes done over every file of an import (their sizes summed once each is declared)."""

    def __init__(self, report: Callable[[int, int | None], None]) -> None:
        self.report = report
        self.done_before = 0
        self.total_before = 0
        self.unknown = False

    def file(self) -> FileProgress:
        def update(done: int, total: int | None) -> None:
            if total is None:
                self.unknown = True
            all_total = None if self.unknown or total is None else self.total_before + total
            self.report(self.done_before + done, all_total)
            if total is not None and done == total:
                self.done_before += done
                self.total_before += total

        return update


async def fetch(
    source: Source,
    sha256: str | None,
    fetcher: Fetcher,
    workdir: Path,
    limits: AdapterLimits,
    progress: Progress,
    credentials: dict[str, str] | None,
    hf_endpoint: str | None,
) -> Fetched:
    budget = Budget(limits.max_archive_bytes)
    if source.kind == "https":
        archive = workdir / ("source" + _suffix(urlsplit(source.url).path))
        got = await fetcher.download(source.url, archive, budget, progress.file())
        _check_sha256(sha256, got, f"{source.shown}: the archive")
        return Fetched(await _extracted(archive, workdir, limits), got.etag, got.sha256)
    if source.kind == "hf":
        return await _fetch_hf(source, sha256, fetcher, workdir, budget, progress, credentials, hf_endpoint)
    return await _fetch_s3(source, sha256, fetcher, workdir, budget, progress, credentials, limits)


def _suffix(path: str) -> str:
    return next(s for s in ARCHIVE_SUFFIXES if path.lower().endswith(s))


async def _extracted(archive: Path, workdir: Path, limits: AdapterLimits) -> Path:
    try:
        root = await asyncio.to_thread(extract_archive, archive, workdir / "extracted", limits)
    except AdapterError as exc:
        raise SourceError(f"adapter refused: {exc}", code=exc.code) from None  # type: ignore[arg-type]
    archive.unlink()
    return root


def _check_sha256(stated: str | None, got: Downloaded, what: str) -> None:
    """The request's `sha256` against the archive's, or (a folder's two files) the weights file's, hash."""
    if stated is not None and got.sha256 != stated:
        raise SourceError(
            f"{what}: its sha256 is {got.sha256}, not the {stated} the request states", code="checksum_mismatch"
        )


async def _fetch_hf(
    source: Source,
    sha256: str | None,
    fetcher: Fetcher,
    workdir: Path,
    budget: Budget,
    progress: Progress,
    credentials: dict[str, str] | None,
    hf_endpoint: str | None,
) -> Fetched:
    endpoint = (hf_endpoint or os.environ.get("HF_ENDPOINT") or HUB).rstrip("/")  # huggingface_hub's variable
    headers = {"Authorization": f"Bearer {credentials['token']}"} if credentials and credentials.get("token") else {}
    info = await fetcher.json(
        f"{endpoint}/api/models/{source.repo}/revision/{quote(source.revision, safe='')}", headers
    )
    commit = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(commit, str) or not COMMIT_RE.match(commit):
        raise SourceError(f"{source.text}: the Hub did not resolve the revision to a commit", code="source_error")
    folder = workdir / "adapter"
    folder.mkdir()
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        got = await fetcher.download(
            f"{endpoint}/{source.repo}/resolve/{commit}/{name}", folder / name, budget, progress.file(), headers
        )
    _check_sha256(sha256, got, f"{source.text}@{commit}: {WEIGHTS_NAME}")
    return Fetched(folder, commit, got.sha256)


@dataclass(frozen=True)
class S3Signer:
    """Signs GETs of one bucket's objects with SigV4 in headers (no credential in any URL, so none in a log line):
    the tenant's keys, or the server's own chain (AWS_* variables, its role); AWS_ENDPOINT_URL honoured."""

    endpoint: str
    region: str
    credentials: Any  # botocore ReadOnlyCredentials

    @classmethod
    def for_tenant(cls, credentials: dict[str, str] | None) -> S3Signer:
        import boto3

        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
        if credentials:
            session = boto3.session.Session(
                aws_access_key_id=credentials["access_key_id"],
                aws_secret_access_key=credentials["secret_access_key"],
                aws_session_token=credentials.get("session_token") or None,
                region_name=credentials.get("region") or region,
            )
        else:
            session = boto3.session.Session(region_name=region)
        found = session.get_credentials()
        if found is None:
            raise SourceError(
                "no S3 credentials: set yours with PUT /v1/credentials/s3 (the server has none of its own)",
                code="source_error",
            )
        client = session.client("s3")  # (no request: it only resolves the endpoint)
        return cls(
            str(client.meta.endpoint_url).rstrip("/"), session.region_name or region, found.get_frozen_credentials()
        )

    def get(self, bucket: str, key: str) -> tuple[str, dict[str, str]]:
        """The path-style URL of the object and the headers that sign a GET of it."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        url = f"{self.endpoint}/{bucket}/{quote(key, safe='/')}"
        request = AWSRequest(method="GET", url=url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
        S3SigV4Auth(self.credentials, "s3", self.region).add_auth(request)
        return url, {k: v for k, v in request.headers.items() if k.lower() != "host"}


async def _fetch_s3(
    source: Source,
    sha256: str | None,
    fetcher: Fetcher,
    workdir: Path,
    budget: Budget,
    progress: Progress,
    credentials: dict[str, str] | None,
    limits: AdapterLimits,
) -> Fetched:
    signer = await asyncio.to_thread(S3Signer.for_tenant, credentials)

    async def download(key: str, dest: Path) -> Downloaded:
        url, headers = signer.get(source.bucket, key)
        try:
            return await fetcher.download(url, dest, budget, progress.file(), headers)
        except SourceError as exc:
            exc.message = f"s3://{source.bucket}/{key}: {exc.message.rsplit(' answered ', 1)[-1]}"
            raise

    if source.key.lower().endswith(ARCHIVE_SUFFIXES):
        archive = workdir / ("source" + _suffix(source.key))
        got = await download(source.key, archive)
        _check_sha256(sha256, got, f"{source.text}: the archive")
        return Fetched(await _extracted(archive, workdir, limits), got.etag, got.sha256)
    folder = workdir / "adapter"
    folder.mkdir()
    etags = []
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        got = await download(f"{source.key}/{name}" if source.key else name, folder / name)
        etags.append((got.etag or "").strip('"'))
    _check_sha256(sha256, got, f"{source.text}: {WEIGHTS_NAME}")
    return Fetched(folder, "etag:" + ",".join(etags), got.sha256)
