"""Adapter blobs in S3-compatible object storage (moto's standalone server): an upload is in the bucket before it
is registered, another replica reads it through its local cache (verified against the blob's content hash, so
a corrupted object is refused, never served), a failed write registers nothing, and a deletion removes the
objects and every replica's local copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

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

pytestmark = pytest.mark.services


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "moto.log")
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)  # the in-process servers' boto3 reads them
    yield server
    server.stop()


def _chat(url: str, key: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)


def test_two_replicas_share_adapters_through_s3(start_server, s3: S3Server, adapter_factory, tmp_path) -> None:
    url = f"s3://{s3.bucket}/adapters"
    # no publish-time warming: replica two must read each version from the bucket when first asked (a warm
    # copy fetched before the object is corrupted below would hide the check on read)
    one = start_server("postgres+redis", data_dir=tmp_path / "one", blob_url=url, warm_adapters=False)
    two = start_server("postgres+redis", data_dir=tmp_path / "two", blob_url=url, warm_adapters=False)
    key = create_tenant(one.url, "s3-tenant")
    r = upload(one.url, key, "remote", archive=zip_folder(adapter_factory("s3-1", seed=95)))
    assert r.status_code == 201, r.text
    [blob] = stored_blobs(one.settings.data_dir)  # replica one's cache holds what it wrote
    assert s3.keys(f"adapters/{blob}/") == [
        f"adapters/{blob}/adapter_config.json",
        f"adapters/{blob}/adapter_model.safetensors",
    ]
    assert stored_blobs(two.settings.data_dir) == []
    assert _chat(two.url, key, "remote").status_code == 200  # downloaded, verified, cached
    assert stored_blobs(two.settings.data_dir) == [blob]

    # A corrupted object is refused on read and not cached.
    second = upload(one.url, key, "remote", archive=zip_folder(adapter_factory("s3-2", seed=96))).json()
    [new_blob] = sorted(set(stored_blobs(one.settings.data_dir)) - {blob})
    s3.client().put_object(Bucket=s3.bucket, Key=f"adapters/{new_blob}/adapter_config.json", Body=b'{"r": 1}')
    r = _chat(two.url, key, f"remote@{second['version']}")
    assert r.status_code == 500 and error_of(r)["code"] == "blob_corrupt"
    assert stored_blobs(two.settings.data_dir) == [blob] and leftover_tmp(two.settings.data_dir) == []

    # Deleting a version removes its objects, and the other replica's local copy.
    assert httpx.delete(f"{one.url}/v1/adapters/remote@1", headers=auth(key)).status_code == 200
    assert s3.keys(f"adapters/{blob}/") == []
    deadline_ok = _eventually(lambda: stored_blobs(two.settings.data_dir) == [])
    assert deadline_ok, stored_blobs(two.settings.data_dir)


def test_a_failed_write_registers_nothing(start_server, s3: S3Server, adapter_factory, tmp_path) -> None:
    server = start_server("postgres+redis", data_dir=tmp_path / "lost", blob_url="s3://no-such-bucket/x")
    key = create_tenant(server.url, "s3-lost")
    r = upload(server.url, key, "lost", archive=zip_folder(adapter_factory("s3-3", seed=97)))
    assert r.status_code == 500
    assert httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"] == []
    assert stored_blobs(server.settings.data_dir) == [] and leftover_tmp(server.settings.data_dir) == []
    assert s3.keys() == []


def _eventually(condition, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
