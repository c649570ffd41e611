"""Test helpers: a uvicorn server in a thread, `loraplex serve` in a subprocess, adapter builders."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from loraplex.envvars.safe_path import python_module_command

ADMIN_KEY = "lpx-admin.test-admin-key-for-the-platform-suite"
PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """Run an ASGI app under uvicorn on a free port in a background thread (real HTTP)."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
            )
        )
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)
        self.settings: Any = None  # the Settings the app was built with (set by the fixture)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def services(self) -> Any:
        """The running app's Services (built by its lifespan)."""
        return self.server.config.app.state.services

    def start(self, timeout: float = 120.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class ServerProcess:
    """`loraplex serve` as a separate OS process, on a free port (`--port`), output in `log`.

    By default it starts as `python -P -m loraplex.platform.cli serve` from `/` without the start-up warm-up
    (it would add up to warmup_s to every start); `command`, `cwd` and `warmup=True` start it another way (the
    README's `.venv/bin/loraplex serve` from the checkout, with its warm-up)."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        log: Path,
        *,
        command: list[str] | None = None,
        cwd: Path | str = "/",
        warmup: bool = False,
    ) -> None:
        self.port = free_port()
        self.log = log
        self._log_file = open(log, "wb")
        serve = command or python_module_command("loraplex.platform.cli", "serve")
        self.proc = subprocess.Popen(
            [*serve, "--port", str(self.port), *args],
            env={**os.environ, **({} if warmup else {"LORAPLEX_WARMUP_S": "0"}), **env},
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


def replica_args(
    model: Path,
    pg_schema: str,
    *,
    redis_url: str = REDIS_URL,
    data_dir: Path | None = None,
    log_level: str | None = "warning",
    extra: Sequence[str] = (),
) -> list[str]:
    """`loraplex serve` arguments for one replica of a cluster sharing PostgreSQL (`pg_schema`) and Redis: the test
    model with a small KV pool (256 blocks, 512 tokens); `data_dir` unless the cluster's store is elsewhere,
    then `extra` (more flags)."""
    args = ["--model", str(model), "--database-url", PG_URL, "--database-schema", pg_schema]
    args += ["--redis-url", redis_url]
    if data_dir is not None:
        args += ["--data-dir", str(data_dir)]
    args += ["--num-kv-blocks", "256", "--max-model-len", "512", *extra]
    if log_level is not None:
        args += ["--log-level", log_level]
    return args


@contextmanager
def running_replicas(args: list[str], env: dict[str, str], logs: Path, count: int = 2) -> Iterator[list[ServerProcess]]:
    """`count` replicas started together with the same `args` and `env` (logs `logs/replica-<i>.log`), yielded once
    all are ready and stopped after (also when one fails to start)."""
    procs = [ServerProcess(args, env, logs / f"replica-{i}.log") for i in range(count)]
    try:
        yield [p.wait_ready() for p in procs]
    finally:
        for p in procs:
            p.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def create_tenant(url: str, name: str, **quotas: Any) -> str:
    """Create a tenant with the admin key; return its first API key."""
    r = httpx.post(f"{url}/v1/tenants", json={"name": name, **quotas}, headers=auth(ADMIN_KEY))
    assert r.status_code == 201, r.text
    return r.json()["api_key"]["key"]


# ----------------------------------------------------------------------------------- adapters


def make_peft_adapter(
    base_dir: Path,
    out: Path,
    *,
    r: int = 4,
    seed: int = 0,
    targets: tuple[str, ...] = ("q_proj", "v_proj", "down_proj"),
    config_overrides: dict | None = None,
    lora_overrides: dict | None = None,
    magnitude_noise: float = 0.0,
) -> Path:
    """A real peft LoRA adapter (random non-zero B) for the model in `base_dir` (or a variant of it).

    ``lora_overrides``: more LoraConfig fields (e.g. ``use_dora=True``); ``magnitude_noise``: DoRA magnitudes
    multiplied by ``1 + noise * N(0, 1)`` (peft initialises them to a factor of exactly 1)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from loraplex.platform.adapters.hf_builds import hf_build

    torch.manual_seed(seed)
    # A server of the test may be building its check's reference in another thread meanwhile: one build at a time.
    with hf_build():
        if config_overrides:
            cfg = AutoConfig.from_pretrained(base_dir, **config_overrides)
            model = AutoModelForCausalLM.from_config(cfg)
        else:
            model = AutoModelForCausalLM.from_pretrained(base_dir)
        lora = dict(
            r=r, lora_alpha=2 * r, target_modules=list(targets), init_lora_weights=False, **(lora_overrides or {})
        )
        peft_model = get_peft_model(model, LoraConfig(**lora))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if magnitude_noise and "lora_magnitude_vector" in name:
                param.mul_(1 + magnitude_noise * torch.randn_like(param))
    peft_model.save_pretrained(out)
    (out / "README.md").unlink(missing_ok=True)
    return out


def zip_folder(folder: Path, extra: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, f"adapter/{f.name}")
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return buf.getvalue()


def targz_folder(folder: Path, symlink: tuple[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for f in sorted(folder.iterdir()):
            tf.add(f, arcname=f.name)
        if symlink is not None:
            info = tarfile.TarInfo(symlink[0])
            info.type = tarfile.SYMTYPE
            info.linkname = symlink[1]
            tf.addfile(info)
    return buf.getvalue()


def upload(
    url: str,
    key: str,
    name: str,
    *,
    archive: bytes | None = None,
    filename: str = "adapter.zip",
    folder: Path | None = None,
    model_file: tuple[str, bytes] | None = None,
) -> httpx.Response:
    """POST /v1/adapters with either one archive or the two files of `folder`."""
    files: dict[str, Any]
    if archive is not None:
        files = {"file": (filename, archive, "application/octet-stream")}
    else:
        assert folder is not None
        weights = model_file or ("adapter_model.safetensors", (folder / "adapter_model.safetensors").read_bytes())
        files = {
            "adapter_config": ("adapter_config.json", (folder / "adapter_config.json").read_bytes()),
            "adapter_model": (weights[0], weights[1]),
        }
    return httpx.post(f"{url}/v1/adapters", data={"name": name}, files=files, headers=auth(key), timeout=60)


def stored_blobs(data_dir: Path) -> list[str]:
    blobs = data_dir / "adapters" / "blobs"
    return sorted(p.name for p in blobs.iterdir()) if blobs.exists() else []


def leftover_tmp(data_dir: Path) -> list[str]:
    """What is in the store's tmp/ besides the processes' own (empty) scratch folders and their lock files."""
    tmp = data_dir / "adapters" / "tmp"
    if not tmp.exists():
        return []
    found = []
    for p in tmp.iterdir():
        if p.name.endswith(".lock") and (tmp / p.name.removesuffix(".lock")).is_dir():
            continue
        if p.is_dir() and (tmp / f"{p.name}.lock").is_file():
            found += [f"{p.name}/{c.name}" for c in p.iterdir()]
        else:
            found.append(p.name)
    return sorted(found)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# ----------------------------------------------------------------------------------- object storage


class S3Server:
    """moto's standalone S3-compatible server as a separate process on a free port, with one bucket."""

    def __init__(self, log: Path, bucket: str = "loraplex-test") -> None:
        self.port = free_port()
        self.bucket = bucket
        self._log_file = open(log, "wb")
        self.proc = subprocess.Popen(
            python_module_command("moto.server", "-H", "127.0.0.1", "-p", str(self.port)),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, log.read_text()[-3000:]
            try:
                httpx.get(self.url, timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "moto server did not start"
                time.sleep(0.1)
        self.client().create_bucket(Bucket=bucket)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a replica needs to reach it (boto3 reads these)."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def keys(self, prefix: str = "") -> list[str]:
        listed = self.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


@dataclass
class EngineGate:
    """An `EngineProbe` callback that holds the engine thread once a sequence samples output position ``hold_at``,
    until ``opened`` is set (while held the engine takes no message: an abort or a new request waits), and records
    each request's Share and furthest sampled position."""

    engine: Any  # the AsyncEngine
    hold_at: int
    opened: threading.Event = field(default_factory=threading.Event)
    waiting: threading.Event = field(default_factory=threading.Event)
    shares: dict[str, Any] = field(default_factory=dict)  # request id -> its engine Share
    furthest: dict[str, int] = field(default_factory=dict)  # request id -> furthest output position sampled

    def on_logits(self, request_ids: list[str], positions: list[int], _logits: Any) -> None:
        running = {s.request_id: s for s in self.engine.engine.scheduler.running}
        for rid, pos in zip(request_ids, positions):
            if rid in running:
                self.shares[rid] = running[rid].share
            self.furthest[rid] = max(pos, self.furthest.get(rid, -1))
        if any(p >= self.hold_at for p in positions) and not self.opened.is_set():
            self.waiting.set()
            self.opened.wait(timeout=120)  # liveness bound: a failing test never hangs the suite

    def wait_held(self) -> None:
        assert self.waiting.wait(timeout=60), "the engine never reached the held position"


@contextmanager
def engine_gate(engine: Any, hold_at: int) -> Iterator[EngineGate]:
    """An `EngineGate` installed as the engine's probe for the block's duration (opened and removed after)."""
    from loraplex.engine.probe import EngineProbe

    gate = EngineGate(engine, hold_at)
    engine.engine.probe = EngineProbe(on_logits=gate.on_logits)
    try:
        yield gate
    finally:
        gate.opened.set()
        engine.engine.probe = None


def eventually(condition: Any, what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until true; past ``timeout`` seconds the test fails naming ``what`` it waited for."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)
