"""Issue 18 over the platform: crash leftovers, bad input that was a 500, upload bombs and concurrency."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from loraplex.engine import RequestError, SamplingParams
from loraplex.platform.storage.blobstore import BlobStore
from loraplex.scratch import sweep
from tests.platform.helpers import ADMIN_KEY, auth, create_tenant, error_of, leftover_tmp, upload, zip_folder
from tests.zip_bomb import write_zip_bomb

REPO = Path(__file__).resolve().parents[2]

# A replica's scratch work: opens the store, writes 7 MB into an upload folder, says where, then waits.
_WORKER = """
import sys, time
from pathlib import Path
from loraplex.platform.storage.blobstore import BlobStore
store = BlobStore(Path(sys.argv[1]))
work = store.new_tmp_dir()
(work / "part-0").write_bytes(bytes(7 << 20))
print(work, flush=True)
time.sleep(600)
"""


def _spawn_worker(root: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(root)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, f"worker exited with {proc.wait()}"
    return proc, Path(line)


def test_a_killed_replicas_scratch_is_removed_at_the_next_start_and_a_live_ones_kept(tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    dead, dead_work = _spawn_worker(root)
    live, live_work = _spawn_worker(root)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        assert (dead_work / "part-0").stat().st_size == 7 << 20  # SIGKILL ran no clean-up
        BlobStore(root)  # what a restarted replica does first: at once, not after an hour
        assert not dead_work.parent.exists() and not Path(f"{dead_work.parent}.lock").exists()
        assert (live_work / "part-0").stat().st_size == 7 << 20  # a live replica's upload is untouched
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait()
    assert sweep(root / "tmp") == [live_work.parent.name]
    assert not live_work.parent.exists()


# load_adapter on an archive, killed in the middle of reading it (after extraction).
_LOADER = """
import os, signal, sys
from pathlib import Path
from loraplex.adapters import BaseModelSpec, load_adapter
import loraplex.adapters.loader as loader
import json

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

loader.read_safetensors_header = die
base = BaseModelSpec.from_hf_config(json.loads(Path(sys.argv[2]).read_text()))
load_adapter(sys.argv[1], base, max_lora_rank=8)
"""


def test_a_loader_killed_mid_load_leaves_nothing_in_the_system_temp_dir(
    tmp_path: Path, adapter_factory, tiny_llama_dir: Path
) -> None:
    archive = tmp_path / "adapter.zip"
    archive.write_bytes(zip_folder(adapter_factory("hygiene")))
    system_tmp, data = tmp_path / "system-tmp", tmp_path / "data"
    system_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(system_tmp), "LORAPLEX_DATA_DIR": str(data)}
    done = subprocess.run(
        [sys.executable, "-c", _LOADER, str(archive), str(tiny_llama_dir / "config.json")], env=env, cwd=REPO
    )
    assert done.returncode == -signal.SIGKILL
    assert list(system_tmp.iterdir()) == []  # was loraplex-adapter-*, removed by nothing, ever
    left = [p for p in (data / "tmp").iterdir() if p.is_dir()]
    assert len(left) == 1 and any(p.name == "adapter_model.safetensors" for p in left[0].rglob("*"))
    assert sweep(data / "tmp") == [left[0].name]
    assert list((data / "tmp").iterdir()) == []


# --- bad input: 400, not 500 ------------------------------------------------------------------


def _chat(url: str, key: str, body: dict | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        headers = {**auth(key), "content-type": "application/json"}
        return httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=60)
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)


def test_deeply_nested_json_is_a_400_naming_the_limit(start_server) -> None:
    server = start_server()
    key = create_tenant(server.url, "deep")
    model = server.services.engine.model_name
    deep = "[" * 10_000 + "]" * 10_000
    base = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    body = json.dumps(base)[:-1] + f', "tools": {deep}}}'
    for r in (
        _chat(server.url, key, body.encode()),
        _chat(server.url, key, {**base, "guided_json": '{"type": "array", "items": ' * 5000 + "{}" + "}" * 5000}),
        httpx.post(f"{server.url}/v1/tenants", content=f'{{"name": {deep}}}', headers=auth(ADMIN_KEY)),
    ):
        assert r.status_code == 400, r.text
        err = error_of(r)
        assert err["code"] == "json_too_deep" and "deeper than 64 levels" in err["message"], err
        assert "max_json_depth" in err["message"]
    assert error_of(_chat(server.url, key, {**base, "guided_json": "[" * 100}))["param"] == "guided_json"
    assert error_of(_chat(server.url, key, body.encode()))["param"] == "tools"  # the field, not the whole body
    # the limit counts from the body's own fields: a field nesting exactly 64 levels is not too deep (the body's
    # envelope is not one of its levels); it is refused for what it is, a tools value of the wrong shape
    exactly = json.dumps(base)[:-1] + ', "tools": ' + "[" * 64 + "]" * 64 + "}"
    assert error_of(_chat(server.url, key, exactly.encode()))["code"] != "json_too_deep"
    # a schema within the limit is served, and the server kept serving through all of the above
    nested = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
    r = _chat(server.url, key, {**base, "response_format": {"type": "json_schema", "json_schema": {"schema": nested}}})
    assert r.status_code == 200, r.text

    small = start_server(max_json_depth=3)  # the limit is a setting
    r = _chat(small.url, create_tenant(small.url, "d"), {**base, "tools": [[[[]]]]})
    assert r.status_code == 400 and "deeper than 3 levels" in error_of(r)["message"]


def test_huge_integers_are_a_400_naming_the_field(start_server) -> None:
    server = start_server()
    key = create_tenant(server.url, "ints")
    model = server.services.engine.model_name
    base = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for field, value in [
        ("seed", 2**70),
        ("seed", -(2**70)),
        ("seed", 2**63),
        ("top_k", 2**70),
        ("min_tokens", 2**70),
        ("stop_token_ids", [2**70]),
        ("max_tokens", 2**70),
        ("n", 2**70),
    ]:
        r = _chat(server.url, key, {**base, field: value})
        assert r.status_code == 400, (field, r.text)
        assert error_of(r)["param"] == field or field in error_of(r)["message"], (field, r.text)
    for seed in (2**63 - 1, -(2**63)):  # the ends of the range are served (with n choices: seed + i)
        r = _chat(server.url, key, {**base, "seed": seed, "n": 2})
        assert r.status_code == 200, r.text
    r = httpx.post(
        f"{server.url}/v1/completions", json={"model": model, "prompt": "hi", "seed": 2**70}, headers=auth(key)
    )
    assert r.status_code == 400 and error_of(r)["param"] == "seed", r.text
    with pytest.raises(RequestError, match=r"seed must be within 64 bits"):  # offline use: the engine's own check
        SamplingParams(seed=2**64)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres+redis", marks=pytest.mark.services)])
def test_huge_tenant_quotas_are_a_400(start_server, backend) -> None:
    server = start_server(backend)
    for field, value in [("max_adapters", 2**31), ("rate_limit_per_minute", 2**40), ("max_adapter_bytes", 2**70)]:
        r = httpx.post(f"{server.url}/v1/tenants", json={"name": f"q-{field}", field: value}, headers=auth(ADMIN_KEY))
        assert r.status_code == 400 and error_of(r)["param"] == field, r.text
    r = httpx.post(f"{server.url}/v1/tenants", json={"name": "ok", "max_adapter_bytes": 2**40}, headers=auth(ADMIN_KEY))
    assert r.status_code == 201, r.text


# --- uploads ------------------------------------------------------------------------------------


def test_an_adapter_whose_scale_overflows_float32_is_refused_at_upload(start_server, adapter_factory, tmp_path) -> None:
    server = start_server()
    key = create_tenant(server.url, "alpha")
    folder = tmp_path / "alpha"
    folder.mkdir()
    for f in adapter_factory("alpha-src").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 1e30}))
    r = upload(server.url, key, "loud", archive=zip_folder(folder))
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["code"] == "scale_too_large" and "lora_alpha / r = 1e+30" in err["message"] and "2^32" in err["message"]
    assert leftover_tmp(server.settings.data_dir) == []


def test_a_zip_bomb_upload_is_refused_before_it_expands(start_server, tmp_path) -> None:
    server = start_server(max_upload_bytes=4 << 20)
    key = create_tenant(server.url, "bomber")
    header = b'{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'  # cut short
    head = struct.pack("<Q", len(header)) + header
    bomb = write_zip_bomb(tmp_path / "b.zip", "adapter_model.safetensors", head, len(head) + 96 * (1 << 24))
    assert bomb.stat().st_size < 2 << 20
    r = upload(server.url, key, "bomb", archive=bomb.read_bytes())
    assert r.status_code == 400, r.text
    assert error_of(r)["code"] == "malformed_safetensors" and "not valid JSON" in error_of(r)["message"]
    assert leftover_tmp(server.settings.data_dir) == []


def _multipart(name: str, archive: bytes) -> tuple[bytes, bytes, str]:
    boundary = "lpx-hygiene-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.zip"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head + archive, f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_concurrent_uploads_are_bounded_per_tenant_and_per_server(start_server, adapter_factory) -> None:
    server = start_server(max_concurrent_uploads=2, max_concurrent_uploads_per_tenant=1)
    keys = {t: create_tenant(server.url, t) for t in ("a", "b", "c")}
    archive = zip_folder(adapter_factory("slots"))
    slots = server.services.upload_slots

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            release = asyncio.Event()

            async def held(tenant: str) -> httpx.Response:
                first, rest, content_type = _multipart(f"held-{tenant}", archive)

                async def body():
                    yield first[:200]  # the upload has started: it holds its slot until its body ends
                    await release.wait()
                    yield first[200:] + rest

                headers = {**auth(keys[tenant]), "content-type": content_type}
                return await client.post("/v1/adapters", content=body(), headers=headers)

            async def wait_for(count: int) -> None:
                deadline = time.monotonic() + 60
                while slots.in_progress() < count:
                    assert time.monotonic() < deadline, "the held upload never started"
                    await asyncio.sleep(0.02)

            def plain(tenant: str, name: str) -> httpx.Response:
                return httpx.post(
                    f"{server.url}/v1/adapters",
                    data={"name": name},
                    files={"file": ("a.zip", archive)},
                    headers=auth(keys[tenant]),
                    timeout=60,
                )

            a = asyncio.create_task(held("a"))
            await wait_for(1)
            r = await asyncio.to_thread(plain, "a", "second")
            assert r.status_code == 429 and r.headers["retry-after"] == "5", r.text
            assert "max_concurrent_uploads_per_tenant = 1" in error_of(r)["message"]
            b = asyncio.create_task(held("b"))
            await wait_for(2)
            r = await asyncio.to_thread(plain, "c", "third")
            assert r.status_code == 429 and r.headers["retry-after"] == "5", r.text
            assert error_of(r)["code"] == "too_many_uploads" and "max_concurrent_uploads = 2" in error_of(r)["message"]
            release.set()
            assert (await a).status_code == 201 and (await b).status_code == 201
            assert slots.in_progress() == 0
            r = await asyncio.to_thread(plain, "c", "third")  # slots free again
            assert r.status_code == 201, r.text

    asyncio.run(scenario())
