"""Imports by reference against real servers: https through a local HTTP server, hf:// through a local server
speaking the Hub's file API (HF_ENDPOINT), s3:// through moto. Each import runs in the background, is checked as
an upload is, and becomes a version that serves; refusals store nothing; transient errors are retried; the
address policy refuses the same local servers when the allow-list the other tests set is absent; credentials
never come back in a response, the status resource or a log line."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from tests.platform.conftest import BACKENDS
from tests.platform.helpers import (
    S3Server,
    auth,
    create_tenant,
    error_of,
    eventually,
    leftover_tmp,
    stored_blobs,
    zip_folder,
)
from tests.platform.import_sources import HubRepo, Reply, SourceServer, source_server

# The local servers listen on 127.0.0.1: these tests allow it explicitly (test_local_sources_are_refused_... shows
# the same URLs refused without it); backoff short so the retries stay quick.
LOCAL = dict(import_allow_networks="127.0.0.1/32", import_allow_http=True, import_retry_base_s=0.05)


@pytest.fixture
def files() -> Iterator[SourceServer]:
    with source_server() as server:
        yield server


def post_import(url: str, key: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/adapters", json=body, headers=auth(key), timeout=30)


def started(url: str, key: str, **body: Any) -> dict[str, Any]:
    r = post_import(url, key, **body)
    assert r.status_code == 202, r.text
    out = r.json()
    assert r.headers["location"] == f"/v1/adapters/{body['name']}/imports/{out['id']}"
    assert out["status"] == "queued" and out["object"] == "adapter.import"
    return out


def finished(url: str, key: str, created: dict[str, Any], timeout: float = 90.0) -> dict[str, Any]:
    """Poll the status resource until the import is ready or failed; every state seen on the way is valid."""
    path = f"{url}/v1/adapters/{created['name']}/imports/{created['id']}"
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(path, headers=auth(key), timeout=30)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["status"] in ("queued", "downloading", "validating", "ready", "failed")
        if out["status"] in ("ready", "failed"):
            return out
        assert time.monotonic() < deadline, f"import still {out['status']}"
        time.sleep(0.05)


def chat(url: str, key: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)


def origins(data_dir: Path, name: str) -> dict[int, dict[str, Any]]:
    """What each version of `name` records as its origin (read from the SQLite registry)."""
    with sqlite3.connect(data_dir / "loraplex.db") as db:
        rows = db.execute("SELECT version, origin FROM adapters WHERE name = ?", (name,)).fetchall()
    return {version: json.loads(origin) for version, origin in rows}


def nothing_stored(server: Any, key: str, scratch: list[str]) -> None:
    """No version, no blob, and no scratch file besides what the server held before the imports (`scratch`)."""
    assert httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"] == []
    assert stored_blobs(server.settings.data_dir) == [] and leftover_tmp(server.settings.data_dir) == scratch


# ------------------------------------------------------------------------------------------------- https


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_https_import_becomes_a_version_that_serves(backend, start_server, files, adapter_factory) -> None:
    server = start_server(backend, **LOCAL)
    key = create_tenant(server.url, "imp-https")
    archive = zip_folder(adapter_factory("imp-1", seed=101))
    sha = hashlib.sha256(archive).hexdigest()
    files.routes["/models/adapter.zip"] = Reply(200, archive, {"ETag": '"v1-etag"'})

    created = started(server.url, key, name="imported", source=f"{files.url}/models/adapter.zip", sha256=sha)
    done = finished(server.url, key, created)
    assert done["status"] == "ready" and done["version"] == 1 and done["error"] is None, done
    assert (done["bytes_done"], done["bytes_total"], done["attempts"]) == (len(archive), len(archive), 1)
    assert done["resolved"] == '"v1-etag"' and done["source"] == f"{files.url}/models/adapter.zip"

    listed = httpx.get(f"{server.url}/v1/adapters/imported", headers=auth(key)).json()
    assert listed["version"] == 1 and listed["status"] == "ready"
    r = chat(server.url, key, "imported")
    assert r.status_code == 200, r.text
    if backend == "sqlite":
        assert origins(server.settings.data_dir, "imported")[1] == {
            "kind": "import",
            "source": f"{files.url}/models/adapter.zip",
            "resolved": '"v1-etag"',
            "sha256": sha,
            "import_id": created["id"],
        }

    # Another tenant sees no such import; a malformed id is the same 404.
    other = create_tenant(server.url, "imp-other")
    for path in (f"imported/imports/{created['id']}", "imported/imports/imp_nothing"):
        r = httpx.get(f"{server.url}/v1/adapters/{path}", headers=auth(other))
        assert r.status_code == 404 and error_of(r)["code"] == "import_not_found"


def test_a_presigned_urls_query_is_sent_and_never_stored_in_clear(start_server, files, adapter_factory, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "imp-signed")
    archive = zip_folder(adapter_factory("imp-signed", seed=111))
    secret = "s3cr3t-signature-0123456789"
    path = f"/bucket/signed.zip?X-Amz-Expires=60&X-Amz-Signature={secret}"
    files.routes[path] = Reply(200, archive)
    sha = hashlib.sha256(archive).hexdigest()

    created = started(server.url, key, name="signed", source=f"{files.url}{path}", sha256=sha)
    done = finished(server.url, key, created)
    assert done["status"] == "ready" and done["version"] == 1, done
    assert path in files.paths()  # the whole URL was fetched
    assert done["source"] == created["source"] == f"{files.url}/bucket/signed.zip"
    assert origins(server.settings.data_dir, "signed")[1]["source"] == f"{files.url}/bucket/signed.zip"
    with sqlite3.connect(server.settings.data_dir / "loraplex.db") as db:
        stored, sealed = db.execute("SELECT source, source_sealed FROM adapter_imports").fetchone()
    assert stored == f"{files.url}/bucket/signed.zip" and sealed and secret not in sealed
    on_disk = b"".join(p.read_bytes() for p in server.settings.data_dir.glob("loraplex.db*"))
    assert secret.encode() not in on_disk and secret not in caplog.text


def test_a_failed_check_fails_the_import_unless_it_accepts_it(
    start_server, files, adapter_factory, wrong_scale
) -> None:
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "imp-check")
    scratch = leftover_tmp(server.settings.data_dir)
    archive = zip_folder(adapter_factory("imp-check", seed=110))
    files.routes["/checked.zip"] = Reply(200, archive)
    body = dict(name="bent", source=f"{files.url}/checked.zip", sha256=hashlib.sha256(archive).hexdigest())

    refused = finished(server.url, key, started(server.url, key, **body))
    assert refused["status"] == "failed" and refused["accept_failed_check"] is False, refused
    assert refused["error"]["code"] == "adapter_check_failed" and "max_logit_diff" in refused["error"]["message"]
    assert refused["attempts"] == 1  # a refusal, not retried
    nothing_stored(server, key, scratch)

    for bad in ("yes", 1, None):
        r = httpx.post(f"{server.url}/v1/adapters", json={**body, "accept_failed_check": bad}, headers=auth(key))
        assert (r.status_code, error_of(r)["param"]) == (400, "accept_failed_check"), r.text
    accepted = finished(server.url, key, started(server.url, key, **body, accept_failed_check=True))
    assert accepted["status"] == "ready" and accepted["accept_failed_check"] is True, accepted
    check = httpx.get(f"{server.url}/v1/adapters/bent", headers=auth(key)).json()["publish_check"]
    assert check["passed"] is False and check["accepted_with_warning"] is True, check


def test_an_https_source_needs_its_sha256_and_a_wrong_one_stores_nothing(start_server, files, adapter_factory) -> None:
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "imp-sha")
    scratch = leftover_tmp(server.settings.data_dir)
    archive = zip_folder(adapter_factory("imp-2", seed=102))
    files.routes["/a.zip"] = Reply(200, archive)

    r = post_import(server.url, key, name="x", source=f"{files.url}/a.zip")
    assert r.status_code == 400 and (error_of(r)["code"], error_of(r)["param"]) == ("invalid_source", "sha256")
    for body, param in (
        ({"source": f"{files.url}/a.zip", "sha256": "ab"}, "sha256"),
        ({"source": f"{files.url}/adapter.bin", "sha256": "0" * 64}, "source"),
        ({"source": "ftp://example.com/a.zip"}, "source"),
        ({"source": "hf://not a repo"}, "source"),
        ({"source": "s3://UPPER_case/x"}, "source"),
        ({"source": "https://user:pass@example.com/a.zip", "sha256": "0" * 64}, "source"),
    ):
        r = post_import(server.url, key, name="x", **body)
        assert r.status_code == 400 and error_of(r)["param"] == param, (body, r.text)
    r = post_import(server.url, key, name="x", source="hf://org/repo", extra=1)
    assert r.status_code == 400 and error_of(r)["code"] == "unknown_field"
    r = post_import(server.url, key, name=5, source="hf://org/repo")
    assert r.status_code == 400 and error_of(r)["param"] == "name"
    r = httpx.post(
        f"{server.url}/v1/adapters", content=b"[1, 2]", headers={**auth(key), "Content-Type": "application/json"}
    )
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_request"
    r = httpx.post(
        f"{server.url}/v1/adapters", content=b"{nope", headers={**auth(key), "Content-Type": "application/json"}
    )
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
    deep = b'{"name": "x", "source": ' + b"[" * 100 + b"]" * 100 + b"}"
    r = httpx.post(f"{server.url}/v1/adapters", content=deep, headers={**auth(key), "Content-Type": "application/json"})
    assert r.status_code == 400 and error_of(r)["code"] == "json_too_deep"
    big = b'{"name": "x", "source": "' + b"a" * (9 << 20) + b'"}'  # past max_request_bytes (8 MiB)
    r = httpx.post(f"{server.url}/v1/adapters", content=big, headers={**auth(key), "Content-Type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"

    wrong = hashlib.sha256(archive + b"!").hexdigest()
    done = finished(server.url, key, started(server.url, key, name="x", source=f"{files.url}/a.zip", sha256=wrong))
    assert done["status"] == "failed" and done["error"]["code"] == "checksum_mismatch" and done["attempts"] == 1
    assert wrong in done["error"]["message"] and done["version"] is None
    nothing_stored(server, key, scratch)


def test_an_archive_the_upload_checks_refuse_fails_with_their_code(start_server, files, tiny_llama_dir) -> None:
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "imp-check")
    scratch = leftover_tmp(server.settings.data_dir)
    bad = zip_folder(tiny_llama_dir, extra={"adapter/pytorch_model.bin": b"pickle"})  # a model, no adapter config
    files.routes["/bad.zip"] = Reply(200, bad)
    done = finished(
        server.url,
        key,
        started(server.url, key, name="bad", source=f"{files.url}/bad.zip", sha256=hashlib.sha256(bad).hexdigest()),
    )
    assert done["status"] == "failed" and done["error"]["code"] not in (None, "internal_error"), done
    nothing_stored(server, key, scratch)


def test_an_oversized_download_fails_while_streaming(start_server, files) -> None:
    server = start_server(**LOCAL)  # max_upload_bytes is 256 KiB in these tests
    key = create_tenant(server.url, "imp-big")
    scratch = leftover_tmp(server.settings.data_dir)
    files.routes["/big.zip"] = Reply(stream_bytes=256 << 20)  # no Content-Length: only the count can stop it
    done = finished(
        server.url, key, started(server.url, key, name="big", source=f"{files.url}/big.zip", sha256="0" * 64)
    )
    assert done["status"] == "failed" and done["error"]["code"] == "source_too_large", done
    deadline = time.monotonic() + 10
    while "/big.zip" not in files.sent:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert files.sent["/big.zip"] < 64 << 20  # hung up early, not after reading it all
    nothing_stored(server, key, scratch)


def test_transient_errors_are_retried_and_client_errors_are_not(start_server, files, adapter_factory) -> None:
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "imp-flaky")
    archive = zip_folder(adapter_factory("imp-3", seed=103))
    sha = hashlib.sha256(archive).hexdigest()
    files.routes["/flaky.zip"] = [Reply(503), Reply(503), Reply(200, archive)]
    done = finished(
        server.url, key, started(server.url, key, name="flaky", source=f"{files.url}/flaky.zip", sha256=sha)
    )
    assert done["status"] == "ready" and done["attempts"] == 3, done
    assert files.paths().count("/flaky.zip") == 3

    files.routes["/gone.zip"] = Reply(404)
    done = finished(server.url, key, started(server.url, key, name="gone", source=f"{files.url}/gone.zip", sha256=sha))
    assert done["status"] == "failed" and done["error"]["code"] == "source_error" and done["attempts"] == 1
    assert files.paths().count("/gone.zip") == 1

    files.routes["/down.zip"] = Reply(503)  # every time: gives up after import_max_attempts
    done = finished(server.url, key, started(server.url, key, name="down", source=f"{files.url}/down.zip", sha256=sha))
    assert done["status"] == "failed" and done["error"]["code"] == "source_unreachable", done
    assert done["attempts"] == 4 and files.paths().count("/down.zip") == 4 and "4 attempts" in done["error"]["message"]


def test_an_import_a_dead_replica_held_is_taken_over_when_its_lease_expires(start_server, files, adapter_factory):
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "imp-lease")
    archive = zip_folder(adapter_factory("imp-4", seed=104))
    files.routes["/a.zip"] = Reply(200, archive)
    now = datetime.now(UTC)
    with sqlite3.connect(server.settings.data_dir / "loraplex.db") as db:
        [(tenant_id,)] = db.execute("SELECT id FROM tenants WHERE name = 'imp-lease'").fetchall()
        row_id = uuid.uuid4()
        db.execute(
            "INSERT INTO adapter_imports (id, tenant_id, name, source, sha256, status, bytes_done, attempts, "
            "lease_owner, lease_until, created_at, updated_at) VALUES (?, ?, 'held', ?, ?, 'downloading', 10, 1, "
            "'dead-replica', ?, ?, ?)",
            (
                row_id.hex,
                tenant_id,
                f"{files.url}/a.zip",
                hashlib.sha256(archive).hexdigest(),
                (now + timedelta(seconds=2)).strftime("%Y-%m-%d %H:%M:%S.%f"),
                now.strftime("%Y-%m-%d %H:%M:%S.%f"),
                now.strftime("%Y-%m-%d %H:%M:%S.%f"),
            ),
        )
    held = {"name": "held", "id": f"imp_{row_id.hex}"}
    time.sleep(1.0)
    assert httpx.get(f"{server.url}/v1/adapters/held/imports/{held['id']}", headers=auth(key)).json()["status"] == (
        "downloading"
    )
    assert files.paths() == []  # not taken while the lease holds
    done = finished(server.url, key, held)
    assert done["status"] == "ready" and done["attempts"] == 2 and done["version"] == 1, done

    # A replica that died after publishing but before recording it: the next one finds the version the import
    # published (its origin names the import) and records it, publishing nothing twice and fetching nothing.
    fetched = len(files.paths())
    with sqlite3.connect(server.settings.data_dir / "loraplex.db") as db:
        db.execute(
            "UPDATE adapter_imports SET status = 'validating', version = NULL, lease_owner = 'dead-replica', "
            "lease_until = ? WHERE id = ?",
            ((now - timedelta(seconds=5)).strftime("%Y-%m-%d %H:%M:%S.%f"), row_id.hex),
        )
    eventually(
        lambda: (
            httpx.get(f"{server.url}/v1/adapters/held/imports/{held['id']}", headers=auth(key)).json()["attempts"] == 3
        ),
        "the import is taken over again",
    )
    again = finished(server.url, key, held)
    assert again["status"] == "ready" and again["version"] == 1, again
    versions = httpx.get(f"{server.url}/v1/adapters/held/versions", headers=auth(key)).json()["data"]
    assert [v["version"] for v in versions] == [1] and len(files.paths()) == fetched


# --------------------------------------------------------------------------------------------------- hf://


def test_hf_import_pins_the_commit_a_moving_branch_resolved_to(
    start_server, files, adapter_factory, monkeypatch, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("HF_ENDPOINT", files.url)
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "imp-hub")
    token = "hf_tenant_secret_token_123"
    r = httpx.put(f"{server.url}/v1/credentials/hf", json={"token": token}, headers=auth(key))
    assert r.status_code == 200 and token not in r.text
    hub = HubRepo(files, "acme/support-lora")
    first = hub.publish(adapter_factory("imp-hub-1", seed=105))

    one = finished(server.url, key, started(server.url, key, name="hub", source="hf://acme/support-lora"))
    assert one["status"] == "ready" and one["resolved"] == first and one["version"] == 1, one
    assert f"/acme/support-lora/resolve/{first}/adapter_model.safetensors" in files.paths()
    assert {s.headers.get("authorization") for s in files.seen} == {f"Bearer {token}"}

    second = hub.publish(adapter_factory("imp-hub-2", seed=106))  # main moves
    assert second != first
    two = finished(server.url, key, started(server.url, key, name="hub", source="hf://acme/support-lora@main"))
    assert two["resolved"] == second and two["version"] == 2
    weights = (adapter_factory("imp-hub-2", seed=106) / "adapter_model.safetensors").read_bytes()
    stated = finished(
        server.url,
        key,
        started(
            server.url, key, name="hub", source="hf://acme/support-lora", sha256=hashlib.sha256(weights).hexdigest()
        ),
    )
    assert stated["status"] == "ready" and stated["version"] == 3, stated  # sha256: the weights file's
    wrong = finished(
        server.url, key, started(server.url, key, name="hub", source="hf://acme/support-lora", sha256="0" * 64)
    )
    assert wrong["status"] == "failed" and wrong["error"]["code"] == "checksum_mismatch", wrong
    pinned = finished(server.url, key, started(server.url, key, name="hub", source=f"hf://acme/support-lora@{first}"))
    assert pinned["status"] == "failed" and pinned["error"]["code"] == "source_error"  # no such revision served

    # Version 1 keeps the commit it resolved to, and the weights of that commit.
    recorded = origins(server.settings.data_dir, "hub")
    assert (recorded[1]["resolved"], recorded[2]["resolved"]) == (first, second)
    assert recorded[1]["source"] == "hf://acme/support-lora"
    v1 = httpx.get(f"{server.url}/v1/adapters/hub@1", headers=auth(key)).json()
    v2 = httpx.get(f"{server.url}/v1/adapters/hub@2", headers=auth(key)).json()
    assert v1["sha256"] != v2["sha256"]
    assert finished(server.url, key, one)["resolved"] == first
    assert chat(server.url, key, "hub@1").status_code == 200

    # The token is in no response and no log line.
    listed = httpx.get(f"{server.url}/v1/credentials", headers=auth(key))
    assert listed.json()["data"] == [{"object": "source.credentials", "kind": "hf", "configured": True}]
    for body in (listed.text, json.dumps([one, two, pinned])):
        assert token not in body
    assert "import" in caplog.text and token not in caplog.text

    # At rest it is Fernet ciphertext under the server's key (a 0600 key file in the data directory by default).
    key_file = server.settings.data_dir / "import-credentials.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    with sqlite3.connect(server.settings.data_dir / "loraplex.db") as db:
        [(kind, ciphertext)] = db.execute("SELECT kind, ciphertext FROM source_credentials").fetchall()
    assert kind == "hf" and token not in ciphertext
    assert json.loads(Fernet(key_file.read_bytes()).decrypt(ciphertext.encode())) == {"token": token}

    # Without the token the Hub's refusal is a failed import (not a retry).
    assert httpx.delete(f"{server.url}/v1/credentials/hf", headers=auth(key)).json()["configured"] is False
    files.seen.clear()
    finished(server.url, key, started(server.url, key, name="hub", source="hf://acme/support-lora"))
    assert {s.headers.get("authorization") for s in files.seen} == {None}


# --------------------------------------------------------------------------------------------------- s3://


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "moto.log")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)  # the server's own chain has no keys: the tenant's are used
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    yield server
    server.stop()


@pytest.mark.services
def test_s3_import_with_the_tenants_own_keys(start_server, s3: S3Server, adapter_factory, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    server = start_server("postgres+redis", **LOCAL)
    key = create_tenant(server.url, "imp-s3")
    folder = adapter_factory("imp-s3-1", seed=107)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        s3.client().put_object(Bucket=s3.bucket, Key=f"runs/7/final/{name}", Body=(folder / name).read_bytes())
    source = f"s3://{s3.bucket}/runs/7/final"
    caplog.clear()  # (the test's own uploads above log their signed requests): from here, the server's lines

    no_keys = finished(server.url, key, started(server.url, key, name="from-s3", source=source))
    assert no_keys["status"] == "failed" and no_keys["error"]["code"] == "source_error", no_keys

    secret = "tenant-secret-access-key-0987"
    keys = {"access_key_id": "AKIATENANT", "secret_access_key": secret}
    r = httpx.put(f"{server.url}/v1/credentials/s3", json=keys, headers=auth(key))
    assert r.status_code == 200 and r.json() == {"object": "source.credentials", "kind": "s3", "configured": True}
    r = httpx.put(f"{server.url}/v1/credentials/s3", json={"access_key_id": "x"}, headers=auth(key))
    assert r.status_code == 400 and error_of(r)["param"] == "secret_access_key"

    done = finished(server.url, key, started(server.url, key, name="from-s3", source=source))
    assert done["status"] == "ready" and done["version"] == 1 and done["resolved"].startswith("etag:"), done
    assert done["bytes_done"] == sum(
        (folder / n).stat().st_size for n in ("adapter_config.json", "adapter_model.safetensors")
    )
    assert chat(server.url, key, "from-s3").status_code == 200
    weights_sha = hashlib.sha256((folder / "adapter_model.safetensors").read_bytes()).hexdigest()
    assert httpx.get(f"{server.url}/v1/adapters/from-s3", headers=auth(key)).json()["origin"]["sha256"] == weights_sha

    archive = zip_folder(adapter_factory("imp-s3-2", seed=109))
    s3.client().put_object(Bucket=s3.bucket, Key="exports/adapter.zip", Body=archive)
    zipped = f"s3://{s3.bucket}/exports/adapter.zip"
    sha = hashlib.sha256(archive).hexdigest()
    done = finished(server.url, key, started(server.url, key, name="from-s3", source=zipped, sha256=sha))
    assert done["status"] == "ready" and done["version"] == 2 and done["bytes_done"] == len(archive), done
    wrong = finished(server.url, key, started(server.url, key, name="from-s3", source=zipped, sha256="0" * 64))
    assert wrong["status"] == "failed" and wrong["error"]["code"] == "checksum_mismatch", wrong

    missing = finished(server.url, key, started(server.url, key, name="from-s3", source=f"s3://{s3.bucket}/nothing"))
    assert missing["status"] == "failed" and missing["error"]["code"] == "source_error"
    assert f"s3://{s3.bucket}/nothing/adapter_config.json" in missing["error"]["message"]

    responses = json.dumps([no_keys, done, missing, wrong])
    assert secret not in responses + caplog.text and "AKIATENANT" not in responses + caplog.text
    assert "Signature" not in responses and "loraplex.platform.imports" in caplog.text


# ------------------------------------------------------------------------------------------ address policy


def test_local_sources_are_refused_without_the_allow_list(start_server, files, adapter_factory, monkeypatch) -> None:
    """The same servers the tests above reach through their allow-list are refused by default."""
    monkeypatch.setenv("HF_ENDPOINT", files.url)
    server = start_server(import_allow_http=True, import_retry_base_s=0.05)
    key = create_tenant(server.url, "imp-ssrf")
    scratch = leftover_tmp(server.settings.data_dir)
    archive = zip_folder(adapter_factory("imp-5", seed=108))
    sha = hashlib.sha256(archive).hexdigest()
    files.routes["/a.zip"] = Reply(200, archive)
    HubRepo(files, "acme/lora").publish(adapter_factory("imp-5", seed=108))

    for host in ("127.0.0.1", "[::1]", "169.254.169.254", "10.0.0.7", "localhost", "[::ffff:127.0.0.1]"):
        r = post_import(server.url, key, name="probe", source=f"http://{host}:{files.port}/a.zip", sha256=sha)
        assert r.status_code == 400 and error_of(r)["code"] == "source_address_refused", (host, r.text)

    # A name resolving to a local address, and the Hub at a local HF_ENDPOINT, fail when fetched.
    monkeypatch.setattr(server.services.imports.policy, "resolver", lambda host, port: ["127.0.0.1"])
    rebind = started(server.url, key, name="rebind", source=f"http://adapters.test:{files.port}/a.zip", sha256=sha)
    hub = started(server.url, key, name="hub", source="hf://acme/lora")
    for created in (rebind, hub):
        done = finished(server.url, key, created)
        assert done["status"] == "failed" and done["error"]["code"] == "source_address_refused", done
        assert done["attempts"] == 1
    assert files.paths() == []  # nothing ever connected
    nothing_stored(server, key, scratch)


def test_a_redirect_to_a_refused_address_fails_the_import(start_server, files) -> None:
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "imp-redirect")
    scratch = leftover_tmp(server.settings.data_dir)
    for target in (
        "http://169.254.169.254/latest/meta-data/iam/",
        f"http://[::1]:{files.port}/a.zip",
        "http://10.0.0.1/a.zip",
    ):
        files.routes["/start.zip"] = Reply(302, headers={"Location": target})
        done = finished(
            server.url, key, started(server.url, key, name="redir", source=f"{files.url}/start.zip", sha256="0" * 64)
        )
        assert done["status"] == "failed" and done["error"]["code"] == "source_address_refused", done
        assert (
            "169.254.169.254" in done["error"]["message"]
            or "::1" in done["error"]["message"]
            or "10.0.0.1" in done["error"]["message"]
        )
    nothing_stored(server, key, scratch)


def test_credentials_under_another_servers_key_are_refused_by_name(start_server, files, tmp_path, monkeypatch) -> None:
    """Replicas must share import_credentials_key: one with another key cannot read them and says so."""
    monkeypatch.setenv("HF_ENDPOINT", files.url)
    one = start_server(data_dir=tmp_path / "shared", import_credentials_key=Fernet.generate_key().decode(), **LOCAL)
    two = start_server(data_dir=tmp_path / "shared", import_credentials_key=Fernet.generate_key().decode(), **LOCAL)
    key = create_tenant(one.url, "imp-keys")
    assert httpx.put(f"{one.url}/v1/credentials/hf", json={"token": "hf_x"}, headers=auth(key)).status_code == 200
    r = httpx.put(f"{one.url}/v1/credentials/gcs", json={"token": "x"}, headers=auth(key))
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    one.stop()  # (its runner would claim the import as readily as two's)
    done = finished(two.url, key, started(two.url, key, name="hub", source="hf://acme/lora"))
    assert done["status"] == "failed" and done["error"]["code"] == "credentials_unreadable", done
    assert files.paths() == []


@pytest.mark.services
def test_two_replicas_run_each_import_once(start_server, files, adapter_factory, tmp_path) -> None:
    """On PostgreSQL the runners claim with SKIP LOCKED: whichever replica takes an import, it runs once. (Four
    different adapters: the check at publish of two copies of one adapter at once is another question.)"""
    one = start_server("postgres+redis", data_dir=tmp_path / "one", **LOCAL)
    two = start_server("postgres+redis", data_dir=tmp_path / "two", **LOCAL)
    key = create_tenant(one.url, "imp-replicas")
    created = []
    for i in range(4):
        archive = zip_folder(adapter_factory(f"imp-rep-{i}", seed=120 + i))
        files.routes[f"/a{i}.zip"] = Reply(200, archive)
        body = dict(name=f"rep{i}", source=f"{files.url}/a{i}.zip", sha256=hashlib.sha256(archive).hexdigest())
        created.append(started((one, two)[i % 2].url, key, **body))
    for i, imp in enumerate(created):
        done = finished((two, one)[i % 2].url, key, imp)  # read from the other replica
        assert (done["status"], done["attempts"], done["version"]) == ("ready", 1, 1), done["error"]
    assert sorted(files.paths()) == [f"/a{i}.zip" for i in range(4)]  # each fetched once
