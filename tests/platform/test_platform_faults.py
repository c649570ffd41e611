"""A dependency down is an answer, not a 500 (platform/faults.py), each fault injected into the real part:
PostgreSQL refusing connections and dropping the server's (as during a restart), the S3 server (moto) killed, an
adapter's blob deleted from the store behind the registry's back, the kernel's own ENOSPC (from /dev/full), and a
data directory on a small filesystem that fills up.
After each, service recovers without a restart."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from loraplex.platform.faults import dependency_error
from tests.platform.helpers import (
    S3Server,
    auth,
    create_tenant,
    error_of,
    leftover_tmp,
    stored_blobs,
    upload,
    zip_folder,
)
from tests.platform.test_platform_batch import jsonl, line, upload_jsonl

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


async def _pg(*statements: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


@contextmanager
def database_refusing_connections() -> Iterator[None]:
    """New connections to `test` refused, open ones terminated (what a PostgreSQL restart does to a client)."""
    asyncio.run(
        _pg(
            "ALTER DATABASE test ALLOW_CONNECTIONS false",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'test' AND pid <> pg_backend_pid()",
        )
    )
    try:
        yield
    finally:
        asyncio.run(_pg("ALTER DATABASE test ALLOW_CONNECTIONS true"))


@pytest.mark.services
def test_database_down_is_a_503_with_retry_after_and_service_recovers(start_server) -> None:
    server = start_server("postgres+redis")
    key = create_tenant(server.url, "faults-db")
    assert httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).status_code == 200
    with database_refusing_connections():
        r = httpx.get(f"{server.url}/v1/adapters", headers=auth(key), timeout=60)
        assert r.status_code == 503, r.text
        assert error_of(r)["code"] == "database_unavailable" and int(r.headers["Retry-After"]) > 0
        ready = httpx.get(f"{server.url}/ready", timeout=60)
        assert ready.status_code == 503 and ready.json()["detail"]["database"] != "ok"
    r = httpx.get(f"{server.url}/v1/adapters", headers=auth(key), timeout=60)
    assert r.status_code == 200, r.text  # the pool reconnects: no restart needed
    assert httpx.get(f"{server.url}/ready", timeout=60).status_code == 200


@pytest.mark.services
def test_blob_store_down_is_a_503_and_ready_names_it(
    start_server, adapter_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = S3Server(tmp_path / "moto.log")
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # (boto3's retries: the answer comes in seconds)
    try:
        server = start_server("sqlite", blob_url=f"s3://{s3.bucket}/adapters", warm_adapters=False)
        key = create_tenant(server.url, "faults-s3")
        archive = zip_folder(adapter_factory("faults-s3", seed=31))
        assert upload(server.url, key, "first", archive=archive).status_code == 201
    finally:
        s3.stop()  # the object store goes away
    r = upload(server.url, key, "second", archive=archive)
    assert r.status_code == 503, r.text
    assert error_of(r)["code"] == "blob_store_unavailable" and "Retry-After" in r.headers
    ready = httpx.get(f"{server.url}/ready", timeout=60)
    assert ready.status_code == 200  # the base model is still served
    assert ready.json()["detail"]["blob_store"].startswith("unavailable")
    names = [a["name"] for a in httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"]]
    assert names == ["first"]  # nothing registered for the refused upload


def test_a_missing_blob_is_named_and_other_requests_are_served(start_server, adapter_factory) -> None:
    server = start_server("sqlite", warm_adapters=False)
    key = create_tenant(server.url, "faults-blob")
    assert (
        upload(server.url, key, "gone", archive=zip_folder(adapter_factory("faults-blob", seed=32))).status_code == 201
    )
    [blob] = stored_blobs(server.settings.data_dir)
    shutil.rmtree(server.settings.data_dir / "adapters" / "blobs" / blob)  # deleted behind the registry's back
    body = {"model": "gone", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)
    assert r.status_code == 500 and error_of(r)["code"] == "adapter_blob_missing", r.text
    assert "gone@1" in error_of(r)["message"]
    # The version is marked broken where its tenant looks (its listing and its versions), saying why.
    shown = httpx.get(f"{server.url}/v1/adapters/gone", headers=auth(key)).json()
    assert shown["status"] == "broken" and "missing from the blob store" in shown["broken_reason"], shown
    versions = httpx.get(f"{server.url}/v1/adapters/gone/versions", headers=auth(key)).json()["data"]
    assert [(v["version"], v["status"]) for v in versions] == [(1, "broken")]
    base = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"][0]["id"]
    r = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "model": base}, headers=auth(key), timeout=60)
    assert r.status_code == 200


def test_a_broken_mark_clears_when_the_stored_files_load_again(start_server, adapter_factory, tmp_path) -> None:
    server = start_server("sqlite", warm_adapters=False)
    key = create_tenant(server.url, "faults-blob-back")
    archive = zip_folder(adapter_factory("faults-blob-back", seed=33))
    assert upload(server.url, key, "back", archive=archive).status_code == 201
    [blob] = stored_blobs(server.settings.data_dir)
    stored = server.settings.data_dir / "adapters" / "blobs" / blob
    shutil.move(stored, tmp_path / "away")  # an operator's mistake, undone below
    body = {"model": "back", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)
    assert error_of(r)["code"] == "adapter_blob_missing"
    assert httpx.get(f"{server.url}/v1/adapters/back", headers=auth(key)).json()["status"] == "broken"
    shutil.move(tmp_path / "away", stored)
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)
    assert r.status_code == 200, r.text
    shown = httpx.get(f"{server.url}/v1/adapters/back", headers=auth(key)).json()
    assert (shown["status"], shown["broken_reason"]) == ("ready", None)


def test_the_kernels_enospc_is_a_507() -> None:
    """A disk-full write as the kernel reports it (writing to /dev/full), raised through a wrapper as the stores'
    writes raise it, is the 507 answer."""
    try:
        with open("/dev/full", "wb") as f:
            f.write(b"x" * 4096)
            f.flush()
    except OSError as disk_full:
        try:
            raise RuntimeError("while storing an upload") from disk_full
        except RuntimeError as wrapped:
            answer = dependency_error(wrapped)
    assert answer is not None and answer.status == 507 and answer.code == "insufficient_storage"
    assert dependency_error(ValueError("a bug")) is None  # anything else stays a 500


@contextmanager
def small_filesystem(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (a real filesystem that fills up: the kernel answers ENOSPC)."""
    where.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        # Mounting needs CAP_SYS_ADMIN; without it this machine cannot make a small filesystem (the kernel's ENOSPC
        # is still checked above through /dev/full).
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_full_data_directory_is_a_507_and_leaves_nothing_half_written(start_server, adapter_factory, tmp_path):
    """The data directory on a small filesystem, filled by a ballast file until 160 KiB are left: uploads use the
    rest until one is refused with 507; that one leaves no blob, no row and no temporary file; the server keeps
    serving; once the ballast goes, the same upload is accepted."""
    with small_filesystem(tmp_path / "small", "8m") as data_dir:
        server = start_server("sqlite", data_dir=data_dir, warm_adapters=False)
        key = create_tenant(server.url, "faults-full", max_adapters=100)
        assert upload(server.url, key, "first", archive=zip_folder(adapter_factory("faults-full-0"))).status_code == 201
        ballast = data_dir / "ballast"
        free = os.statvfs(data_dir).f_bavail * os.statvfs(data_dir).f_frsize
        ballast.write_bytes(b"\0" * (free - 160 * 1024))
        accepted, refused = ["first"], None
        for i in range(1, 40):
            r = upload(server.url, key, f"fill-{i}", archive=zip_folder(adapter_factory(f"faults-full-{i}", seed=i)))
            if r.status_code != 201:
                refused = r
                break
            accepted.append(f"fill-{i}")
        assert refused is not None, "the filesystem never filled"
        assert refused.status_code == 507 and error_of(refused)["code"] == "insufficient_storage", refused.text
        listed = [a["name"] for a in httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"]]
        assert sorted(listed) == sorted(accepted)  # no row for the refused upload
        assert len(stored_blobs(data_dir)) == len(accepted)  # and no blob
        assert leftover_tmp(data_dir) == []
        # A batch input file larger than what is left: refused the same way, nothing listed.
        lines = [
            line(f"q{i}", {"model": "first", "messages": [{"role": "user", "content": "x" * 900}]}) for i in range(400)
        ]
        r = upload_jsonl(server.url, key, jsonl(lines))
        assert r.status_code == 507 and error_of(r)["code"] == "insufficient_storage", r.text
        assert httpx.get(f"{server.url}/v1/files", headers=auth(key)).json()["data"] == []
        assert leftover_tmp(data_dir) == []
        body = {"model": "first", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)
        assert r.status_code == 200, r.text
        ballast.unlink()
        again = upload(
            server.url,
            key,
            f"fill-{len(accepted)}",
            archive=zip_folder(adapter_factory(f"faults-full-{len(accepted)}")),
        )
        assert again.status_code == 201, again.text
