"""Adapters over REST: both upload forms, versions, listing, deletion, quotas, isolation between
tenants, and every kind of bad upload refused with a clear 4xx leaving neither row nor file."""

from __future__ import annotations

import io
import json
import socket
import struct
import zipfile

import httpx
import pytest
import torch

from tests.platform.conftest import MAX_UPLOAD
from tests.platform.helpers import (
    ADMIN_KEY,
    auth,
    create_tenant,
    error_of,
    leftover_tmp,
    stored_blobs,
    targz_folder,
    upload,
    zip_folder,
)

EXPECTED_FIELDS = {
    "id",
    "name",
    "model",
    "version",
    "sha256",
    "rank",
    "alpha",
    "target_modules",
    "size_bytes",
    "created_at",
    "status",
    "broken_reason",
    "origin",
    "publish_check",
}


def test_upload_archive_and_two_files_then_list_get_delete(server, adapter_factory) -> None:
    key = create_tenant(server.url, "owner")
    folder = adapter_factory("basic")
    r = upload(server.url, key, "support-bot", archive=zip_folder(folder))
    assert r.status_code == 201, r.text
    first = r.json()
    assert set(first) == EXPECTED_FIELDS
    assert (first["name"], first["model"], first["version"], first["rank"], first["alpha"]) == (
        "support-bot",
        "owner/support-bot",  # the globally unique model id
        1,
        4,
        8.0,
    )
    assert first["target_modules"] == ["q_proj", "v_proj", "down_proj"] and len(first["sha256"]) == 64
    assert first["created_at"].endswith(("Z", "+00:00"))

    # The same adapter as two files under a second name; a .tar.gz re-upload is version 2 of the first.
    r = upload(server.url, key, "other", folder=folder)
    assert r.status_code == 201 and r.json()["sha256"] == first["sha256"]
    r = upload(
        server.url,
        key,
        "support-bot",
        archive=targz_folder(adapter_factory("basic-r8", r=8, seed=1)),
        filename="a.tar.gz",
    )
    assert r.status_code == 201, r.text
    second = r.json()
    assert second["version"] == 2 and second["rank"] == 8 and second["sha256"] != first["sha256"]

    listed = httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()
    assert [(a["name"], a["version"]) for a in listed["data"]] == [("other", 1), ("support-bot", 2)]
    got = httpx.get(f"{server.url}/v1/adapters/support-bot", headers=auth(key)).json()
    assert got["id"] == second["id"] and got["sha256"] == second["sha256"]
    # Version 1 is kept (the default retention keeps 5 per name) and still addressable as name@1.
    assert len(stored_blobs(server.settings.data_dir)) == 3
    old = httpx.get(f"{server.url}/v1/adapters/support-bot@1", headers=auth(key)).json()
    assert (old["id"], old["version"], old["sha256"]) == (first["id"], 1, first["sha256"])

    # Deleting the name deletes every version.
    r = httpx.delete(f"{server.url}/v1/adapters/support-bot", headers=auth(key))
    assert r.status_code == 200 and r.json()["version"] == 2
    for model in ("support-bot", "support-bot@1", "support-bot@2"):
        assert httpx.get(f"{server.url}/v1/adapters/{model}", headers=auth(key)).status_code == 404
    assert httpx.delete(f"{server.url}/v1/adapters/support-bot", headers=auth(key)).status_code == 404
    assert len(stored_blobs(server.settings.data_dir)) == 1
    # Re-uploading after a delete continues the version sequence.
    r = upload(server.url, key, "support-bot", archive=zip_folder(folder))
    assert r.status_code == 201 and r.json()["version"] == 3
    assert leftover_tmp(server.settings.data_dir) == []


def test_dora_adapter_is_accepted_and_served(start_server, adapter_factory, tiny_llama_dir) -> None:
    """A DoRA adapter (use_dora, magnitudes away from their initial row norms) uploads like any other, and its
    greedy completion is peft's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    server = start_server("sqlite")
    key = create_tenant(server.url, "dora-owner")
    folder = adapter_factory("dora", seed=21, lora_overrides={"use_dora": True}, magnitude_noise=0.3)
    r = upload(server.url, key, "dora-bot", archive=zip_folder(folder))
    assert r.status_code == 201, r.text
    prompt = [11, 22, 33, 44, 55, 66]

    def complete(model: str) -> str:
        body = {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
        r = httpx.post(f"{server.url}/v1/completions", headers=auth(key), timeout=60, json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    base = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(base, str(folder)).eval()
    with torch.inference_mode():
        out = peft.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    assert complete("dora-bot") == tokenizer.decode(out[0, len(prompt) :].tolist())


def test_dora_factor_past_the_bound_is_refused_at_upload(start_server, adapter_factory, tmp_path) -> None:
    """A DoRA factor magnitude / ||W + s B A|| over 2^32 (one magnitude vector scaled by 1e12) is refused by the
    upload's inspection, computed against the engine's base weights: a 400 naming it, and nothing stored (not a
    version that fails when the engine first reads it)."""
    import shutil

    from safetensors.torch import load_file, save_file

    server = start_server("sqlite")
    key = create_tenant(server.url, "dora-huge")
    folder = tmp_path / "huge"
    shutil.copytree(adapter_factory("dora", seed=21, lora_overrides={"use_dora": True}, magnitude_noise=0.3), folder)
    weights = folder / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    name = next(k for k in tensors if k.endswith("layers.1.mlp.down_proj.lora_magnitude_vector"))
    tensors[name] = tensors[name] * 1e12
    save_file(tensors, str(weights))

    for kwargs in ({"archive": zip_folder(folder)}, {"folder": folder}):
        r = upload(server.url, key, "dora-bot", **kwargs)
        assert r.status_code == 400, r.text
        err = error_of(r)
        assert err["code"] == "scale_too_large", err
        assert "layers.1: a DoRA factor" in err["message"] and "down projection" in err["message"], err
    assert httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"] == []
    assert stored_blobs(server.settings.data_dir) == []
    assert leftover_tmp(server.settings.data_dir) == []


def test_isolation_between_tenants(server, adapter_factory) -> None:
    key_a = create_tenant(server.url, "iso-a")
    key_b = create_tenant(server.url, "iso-b")
    r = httpx.post(f"{server.url}/v1/tenants/iso-b/keys", headers=auth(key_b))
    keys_b = [key_b, r.json()["key"]]
    assert upload(server.url, key_a, "secret-sauce", archive=zip_folder(adapter_factory("basic"))).status_code == 201
    for kb in keys_b:
        assert httpx.get(f"{server.url}/v1/adapters", headers=auth(kb)).json()["data"] == []
        models = [m["id"] for m in httpx.get(f"{server.url}/v1/models", headers=auth(kb)).json()["data"]]
        assert "secret-sauce" not in models
        r_other = httpx.get(f"{server.url}/v1/adapters/secret-sauce", headers=auth(kb))
        r_missing = httpx.get(f"{server.url}/v1/adapters/no-such-thing", headers=auth(kb))
        assert r_other.status_code == r_missing.status_code == 404
        assert error_of(r_other)["code"] == error_of(r_missing)["code"] == "adapter_not_found"
        assert httpx.delete(f"{server.url}/v1/adapters/secret-sauce", headers=auth(kb)).status_code == 404
        # Using it is a 404 exactly like a model that does not exist.
        used = httpx.post(
            f"{server.url}/v1/completions",
            headers=auth(kb),
            json={"model": "secret-sauce", "prompt": "hi", "max_tokens": 2},
        )
        missing = httpx.post(
            f"{server.url}/v1/completions",
            headers=auth(kb),
            json={"model": "secret-saucf", "prompt": "hi", "max_tokens": 2},
        )
        assert used.status_code == missing.status_code == 404
        assert error_of(used)["message"].replace("secret-sauce", "X") == error_of(missing)["message"].replace(
            "secret-saucf", "X"
        )
        # B may upload its own adapter under the same name without touching A's.
        assert (
            upload(
                server.url, kb, "secret-sauce", archive=zip_folder(adapter_factory("basic-r8", r=8, seed=1))
            ).status_code
            == 201
        )
        assert httpx.delete(f"{server.url}/v1/adapters/secret-sauce", headers=auth(kb)).status_code == 200
    still = httpx.get(f"{server.url}/v1/adapters/secret-sauce", headers=auth(key_a))
    assert still.status_code == 200 and still.json()["rank"] == 4


def test_each_tenant_resolves_its_own_same_named_adapter_through_the_cache(server, adapter_factory) -> None:
    """Two tenants, one adapter name, different weights: lookups interleaved so that each tenant's record is
    cached (in-process, or in Redis with PostgreSQL) before the other asks. Each sees and serves only its own."""
    keys = {rank: create_tenant(server.url, f"same-name-r{rank}") for rank in (4, 8)}
    for rank, key in keys.items():
        folder = adapter_factory(f"same-name-r{rank}", r=rank, seed=rank)
        assert upload(server.url, key, "shared-name", archive=zip_folder(folder)).status_code == 201
    for _ in range(2):
        for rank, key in keys.items():
            for model in ("shared-name", "shared-name@1"):  # the current version and a pinned one
                r = httpx.get(f"{server.url}/v1/adapters/{model}", headers=auth(key))
                assert r.status_code == 200 and r.json()["rank"] == rank, (rank, model, r.text)
    texts = {}
    for rank, key in keys.items():
        r = httpx.post(
            f"{server.url}/v1/completions",
            headers=auth(key),
            json={"model": "shared-name", "prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0, "logprobs": 1},
        )
        assert r.status_code == 200, r.text
        texts[rank] = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert texts[4] != texts[8]  # different weights answered


def test_quotas(server, adapter_factory) -> None:
    small = adapter_factory("basic")
    key = create_tenant(server.url, "quota", max_adapters=2)
    assert upload(server.url, key, "one", archive=zip_folder(small)).status_code == 201
    assert upload(server.url, key, "two", archive=zip_folder(small)).status_code == 201
    blobs = stored_blobs(server.settings.data_dir)
    r = upload(server.url, key, "three", archive=zip_folder(small))
    assert r.status_code == 403 and error_of(r)["code"] == "adapter_quota_exceeded"
    assert "2 adapters" in error_of(r)["message"]
    # A new version of an existing name is not a new adapter (its version 1 is kept beside it).
    assert upload(server.url, key, "two", archive=zip_folder(small)).status_code == 201
    assert len(stored_blobs(server.settings.data_dir)) == len(blobs) + 1

    size = upload(server.url, create_tenant(server.url, "probe"), "p", folder=small).json()["size_bytes"]
    key = create_tenant(server.url, "bytes", max_adapter_bytes=size + size // 2)
    assert upload(server.url, key, "fits", folder=small).status_code == 201
    r = upload(server.url, key, "too-much", folder=small)
    assert r.status_code == 403 and error_of(r)["code"] == "storage_quota_exceeded"
    names = [a["name"] for a in httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"]]
    assert names == ["fits"]
    # Every kept version counts against the bytes: a second version of "fits" is over too, unless the tenant
    # keeps one version per name (then the upload retires version 1).
    r = upload(server.url, key, "fits", folder=small)
    assert r.status_code == 403 and error_of(r)["code"] == "storage_quota_exceeded"
    r = httpx.patch(f"{server.url}/v1/tenants/bytes", json={"adapter_versions_kept": 1}, headers=auth(ADMIN_KEY))
    assert r.status_code == 200 and r.json()["adapter_versions_kept"] == 1
    r = upload(server.url, key, "fits", folder=small)
    assert r.status_code == 201 and r.json()["version"] == 2
    versions = httpx.get(f"{server.url}/v1/adapters/fits/versions", headers=auth(key)).json()
    assert (versions["current"], [v["version"] for v in versions["data"]]) == (2, [2])


# ------------------------------------------------------------------------------- bad uploads


def _pickle_bytes() -> bytes:
    buf = io.BytesIO()
    torch.save({"weight": torch.zeros(2)}, buf)
    return buf.getvalue()


def _malformed_safetensors() -> bytes:
    header = b'{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": {"dtype": "F32", "shape": [4'
    return struct.pack("<Q", len(header)) + header + b"\x00" * 64


def _bad_uploads(adapter_factory) -> dict[str, tuple[dict, int, str]]:
    good = adapter_factory("basic")
    wrong = adapter_factory(
        "wrong-shape",
        config_overrides={
            "hidden_size": 32,
            "intermediate_size": 96,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
    )
    config = (good / "adapter_config.json").read_bytes()
    escaping = zip_folder(good, extra={"../../escape.txt": b"owned"})
    return {
        "dotdot-zip": ({"archive": escaping}, 400, "unsafe_archive"),
        "symlink-tar": (
            {
                "archive": targz_folder(good, symlink=("adapter_model2.safetensors", "/etc/passwd")),
                "filename": "a.tar.gz",
            },
            400,
            "unsafe_archive",
        ),
        "pickle-two-files": (
            {"folder": good, "model_file": ("adapter_model.bin", _pickle_bytes())},
            400,
            "pickled_weights",
        ),
        "pickle-in-archive": (
            {"archive": zip_folder(good, extra={"adapter/adapter_model.bin": _pickle_bytes()})},
            400,
            "pickled_weights",
        ),
        "pickle-archive-name": ({"archive": _pickle_bytes(), "filename": "adapter.pt"}, 400, "pickled_weights"),
        "wrong-shape": ({"folder": wrong}, 400, "wrong_base_model"),
        "malformed-header": (
            {"folder": good, "model_file": ("adapter_model.safetensors", _malformed_safetensors())},
            400,
            "malformed_safetensors",
        ),
        "not-an-archive": ({"archive": b"just some text", "filename": "notes.txt"}, 400, "unsupported_archive"),
        "bad-config-json": (
            {
                "archive": _zip(
                    {
                        "adapter_config.json": b"{nope",
                        "adapter_model.safetensors": (good / "adapter_model.safetensors").read_bytes(),
                    }
                )
            },
            400,
            "invalid_config",
        ),
        "oversized": ({"archive": b"\x00" * (MAX_UPLOAD + 1)}, 413, "request_too_large"),
        "config-only-zip": ({"archive": _zip({"adapter_config.json": config})}, 400, "missing_file"),
    }


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize(
    "case",
    [
        "dotdot-zip",
        "symlink-tar",
        "pickle-two-files",
        "pickle-in-archive",
        "pickle-archive-name",
        "wrong-shape",
        "malformed-header",
        "not-an-archive",
        "bad-config-json",
        "oversized",
        "config-only-zip",
    ],
)
def test_bad_uploads_are_refused_and_leave_nothing(start_server, adapter_factory, case) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "victim")
    kwargs, status, code = _bad_uploads(adapter_factory)[case]
    r = upload(server.url, key, "bad", **kwargs)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["code"] == code, err
    assert len(err["message"]) > 20
    assert httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"] == []
    assert stored_blobs(server.settings.data_dir) == []
    assert leftover_tmp(server.settings.data_dir) == []
    assert not (server.settings.data_dir.parent / "escape.txt").exists()


def test_upload_size_limit_applies_while_streaming(start_server) -> None:
    """A chunked upload (no Content-Length) over the limit gets its 413 while the client is still
    sending: the server refuses at the limit instead of buffering the whole body first."""
    server = start_server("sqlite")
    key = create_tenant(server.url, "streamer")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/adapters HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer "
            + key.encode()
            + b"\r\nContent-Type: multipart/form-data; boundary=xyz\r\nTransfer-Encoding: chunked\r\n\r\n"
        )

        def chunk(data: bytes) -> None:
            sock.sendall(b"%x\r\n" % len(data) + data + b"\r\n")

        chunk(b'--xyz\r\nContent-Disposition: form-data; name="name"\r\n\r\nbig\r\n')
        chunk(b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.zip"\r\n\r\n')
        for _ in range(MAX_UPLOAD // 65536 + 2):  # just over the limit; the body is never finished
            chunk(b"\x00" * 65536)
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"request_too_large" in reply
    assert leftover_tmp(server.settings.data_dir) == [] and stored_blobs(server.settings.data_dir) == []


def test_malformed_multipart_requests(start_server, adapter_factory) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "forms")
    good = adapter_factory("basic")
    r = httpx.post(f"{server.url}/v1/adapters", content=b"name=x", headers={**auth(key), "Content-Type": "text/plain"})
    assert r.status_code == 415 and error_of(r)["code"] == "unsupported_media_type"
    r = httpx.post(f"{server.url}/v1/adapters", json={"name": "x"}, headers=auth(key))  # JSON: an import, no source
    assert r.status_code == 400 and (error_of(r)["code"], error_of(r)["param"]) == ("invalid_source", "source")
    r = httpx.post(f"{server.url}/v1/adapters", files={"file": ("a.zip", zip_folder(good))}, headers=auth(key))
    assert r.status_code == 400 and error_of(r)["param"] == "name"
    r = upload(server.url, key, "../../etc", archive=zip_folder(good))
    assert r.status_code == 400 and error_of(r)["param"] == "name"
    r = httpx.post(
        f"{server.url}/v1/adapters",
        data={"name": "x"},
        headers=auth(key),
        files={"adapter_config": ("adapter_config.json", (good / "adapter_config.json").read_bytes())},
    )
    assert r.status_code == 400 and "adapter_model" in error_of(r)["message"]
    r = httpx.post(
        f"{server.url}/v1/adapters", data={"name": "x"}, headers=auth(key), files={"weights": ("w.bin", b"123")}
    )
    assert r.status_code == 400 and error_of(r)["param"] == "weights"
    r = httpx.post(
        f"{server.url}/v1/adapters",
        headers={**auth(key), "Content-Type": "multipart/form-data; boundary=zz"},
        content=b"garbage",
    )
    assert r.status_code == 400
    # Uploading under the base model's name would shadow it.
    base = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"][0]["id"]
    r = upload(server.url, key, base, archive=zip_folder(good))
    assert r.status_code == 400 and error_of(r)["param"] == "name"
    assert stored_blobs(server.settings.data_dir) == [] and leftover_tmp(server.settings.data_dir) == []


def test_adapter_config_without_weights_is_listed_nowhere(start_server, adapter_factory) -> None:
    """A config JSON that is not an object is refused by the adapter checks, not by a crash."""
    server = start_server("sqlite")
    key = create_tenant(server.url, "json")
    good = adapter_factory("basic")
    r = upload(server.url, key, "x", folder=good, model_file=("adapter_model.safetensors", json.dumps([1, 2]).encode()))
    assert r.status_code == 400 and error_of(r)["code"] == "malformed_safetensors"


@pytest.mark.services
def test_concurrent_uploads_on_postgresql_get_versions_and_keep_quotas(start_server, adapter_factory) -> None:
    """Six uploads of one name at once, then five new names at once against a quota of two: every upload is
    a new version or a clear refusal, the quota holds, and exactly the live adapters have blobs on disk (the
    tenant keeps one version per name: each upload retires the one before)."""
    from concurrent.futures import ThreadPoolExecutor

    # above the default concurrent-upload limits (test_platform_hygiene tests those)
    server = start_server("postgres+redis", max_concurrent_uploads=8, max_concurrent_uploads_per_tenant=8)
    key = create_tenant(server.url, "racer", max_adapters=2, adapter_versions_kept=1)
    same = [zip_folder(adapter_factory(f"race-{i}", seed=60 + i)) for i in range(6)]
    with ThreadPoolExecutor(len(same)) as pool:
        results = list(pool.map(lambda archive: upload(server.url, key, "same", archive=archive), same))
    assert {r.status_code for r in results} <= {201, 409}, [r.text for r in results]
    versions = sorted(r.json()["version"] for r in results if r.status_code == 201)
    assert versions == list(range(1, len(versions) + 1))  # no version twice, none skipped
    for r in results:
        if r.status_code == 409:
            assert error_of(r)["code"] == "conflict"
    live = httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"]
    assert [(a["name"], a["version"]) for a in live] == [("same", versions[-1])]

    names = [zip_folder(adapter_factory(f"quota-{i}", seed=70 + i)) for i in range(5)]
    with ThreadPoolExecutor(len(names)) as pool:
        results = list(pool.map(lambda i: upload(server.url, key, f"n{i}", archive=names[i]), range(len(names))))
    codes = sorted(r.status_code for r in results)
    assert codes == [201, 403, 403, 403, 403]  # "same" holds one of the two places
    assert all(error_of(r)["code"] == "adapter_quota_exceeded" for r in results if r.status_code == 403)
    live = httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"]
    assert len(live) == 2
    assert len(stored_blobs(server.settings.data_dir)) == 2  # no orphan: refused and replaced uploads left nothing
    assert leftover_tmp(server.settings.data_dir) == []
