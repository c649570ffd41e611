"""deploy/compose.yaml's services started on this machine from what it has, with the compose file's own settings:
PostgreSQL and Redis are the machine's servers (standing in for the postgres:16 and redis:7 images), moto's
S3 server from PyPI stands in for MinIO (the minio-bucket job's bucket created the same way), and the two
replicas are `loraplex serve` processes with each replica's `environment` exactly as the compose file
interpolates it, host names pointed at those stand-ins (and the tiny test model instead of the image's
default, for speed). The replicas must pass the compose healthcheck (/ready), share state (an adapter uploaded
through one is served by the other from the object store) and drain on SIGTERM. The load balancer (nginx)
runs when an nginx binary is here; when it is not, and Docker cannot run its image, the test says so in a
warning naming what is missing."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

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


def docker_unavailable() -> str | None:
    """Why Docker cannot run an image here (None when it can)."""
    if shutil.which("docker") is None:
        return "no docker client"
    r = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or ["docker info failed"])[-1]
    return None


def test_compose_services_start_from_what_this_machine_has(tmp_path, tiny_llama_dir, pg_schema, adapter_factory):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    vars_ = {"LORAPLEX_ADMIN_KEY": ADMIN_KEY}

    s3 = S3Server(tmp_path / "moto.log", bucket="loraplex-adapters")  # MinIO + the minio-bucket job
    local = {"redis:6379": urlsplit(REDIS_URL).netloc, "minio:9000": urlsplit(s3.url).netloc}
    replicas: list[ServerProcess] = []
    lb: subprocess.Popen | None = None
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
        one, two = replicas

        key = create_tenant(one.url, "compose")
        r = upload(one.url, key, "bot", archive=zip_folder(adapter_factory("compose-bot", seed=5)))
        assert r.status_code == 201, r.text
        chat = {"model": "bot", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        served = httpx.post(f"{two.url}/v1/chat/completions", json=chat, headers=auth(key), timeout=120)
        assert served.status_code == 200, served.text  # replica two read the blob from the object store
        assert s3.client().list_objects_v2(Bucket="loraplex-adapters", Prefix="blobs/")["KeyCount"] >= 1

        nginx = shutil.which("nginx")
        if nginx is None:
            why = docker_unavailable() or "not tried"
            warnings.warn(
                f"compose service lb ({services['lb']['image']}) not started: no nginx binary on this machine, "
                f"and Docker cannot run its image ({why}); the replicas were checked directly",
                stacklevel=1,
            )
        else:
            port = free_port()
            conf = (DEPLOY / "nginx.conf").read_text().replace("listen 8000", f"listen 127.0.0.1:{port}")
            for i, replica in enumerate(replicas, 1):
                conf = conf.replace(f"server replica-{i}:8000", f"server 127.0.0.1:{replica.port}")
            (tmp_path / "nginx").mkdir()
            (tmp_path / "nginx" / "nginx.conf").write_text(f"pid {tmp_path}/nginx/nginx.pid;\n{conf}")
            lb = subprocess.Popen(
                [nginx, "-p", str(tmp_path / "nginx"), "-c", "nginx.conf", "-g", "daemon off; error_log stderr;"]
            )
            url = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    httpx.get(f"{url}/health", timeout=2)
                    break
                except httpx.HTTPError:
                    assert lb.poll() is None, "nginx exited"
                    time.sleep(0.1)
            assert (
                httpx.post(f"{url}/v1/chat/completions", json=chat, headers=auth(key), timeout=120).status_code == 200
            )

        # `docker compose stop` sends stop_signal and waits stop_grace_period: the replica drains and exits
        grace = float(services["replica-1"]["stop_grace_period"].removesuffix("s"))
        one.proc.send_signal(getattr(signal, services["replica-1"]["stop_signal"]))
        assert one.proc.wait(timeout=grace) == 0
        assert (
            httpx.post(f"{two.url}/v1/chat/completions", json=chat, headers=auth(key), timeout=120).status_code == 200
        )
    finally:
        if lb is not None:
            lb.terminate()
            lb.wait(timeout=30)
        for replica in replicas:
            replica.stop()
        s3.stop()
