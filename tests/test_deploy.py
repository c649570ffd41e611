"""deploy/: every Kubernetes manifest parses and its core resources validate against Kubernetes' published
JSON schemas (the kubernetes-validate package, strict: unknown fields fail); the inference extension's and
Gateway API's resources (CRDs, no schema in that package) are checked field by field against their v1 specs
and against the Deployment they route to. The compose file is parsed and checked the same way; it is not
started here (CI machines have no Docker daemon)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from loraplex.platform.settings import Settings, parse_blob_url

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
K8S_VERSION = "1.33.0"
CRD_GROUPS = ("inference.networking.k8s.io/", "gateway.networking.k8s.io/")
BOTO3_ENV = {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION"}


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("doc", _docs(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_core_manifests_validate_against_kubernetes_schemas(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith(CRD_GROUPS):
        return  # checked field by field below
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_replicas_probe_drain_and_use_real_settings() -> None:
    docs = _docs()
    deployment = _one(docs, "Deployment", "loraplex")
    pod = deployment["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    env = _env(server)
    settings = {f.name for f in dataclasses.fields(Settings)}
    for name in env:  # every variable is a setting loraplex or boto3 reads (a typo would be silently ignored)
        assert name in BOTO3_ENV or name.removeprefix("LORAPLEX_").lower() in settings, name
        assert name in BOTO3_ENV or name.startswith("LORAPLEX_"), name
    pre_stop_s = int(server["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + float(env["LORAPLEX_DRAIN_TIMEOUT_S"])
    secret = _one(docs, "Secret", "loraplex")
    for value in env.values():
        if isinstance(value, dict) and "secretKeyRef" in value:
            ref = value["secretKeyRef"]
            assert ref["name"] == "loraplex" and ref["key"] in secret["stringData"]
    (port,) = server["ports"]
    assert port["containerPort"] == int(env["LORAPLEX_PORT"])
    # adapter blobs in the object store, credentials from the secret; no volume shared between replicas
    assert parse_blob_url(secret["stringData"][env["LORAPLEX_BLOB_URL"]["secretKeyRef"]["key"]])[0]
    assert {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env)
    (data,) = [v for v in pod["volumes"] if v["name"] == server["volumeMounts"][0]["name"]]
    assert "emptyDir" in data and server["volumeMounts"][0]["mountPath"] == env["LORAPLEX_DATA_DIR"]
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]


def test_inference_pool_routes_to_the_replicas_through_the_picker() -> None:
    docs = _docs()
    deployment = _one(docs, "Deployment", "loraplex")
    pool = _one(docs, "InferencePool", "loraplex")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    assert set(spec) <= {"selector", "targetPorts", "endpointPickerRef"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert [p["number"] for p in spec["targetPorts"]] == [container["ports"][0]["containerPort"]]
    picker = spec["endpointPickerRef"]
    assert picker["failureMode"] in ("FailOpen", "FailClose")
    service = _one(docs, "Service", picker["name"])
    assert picker["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    epp = _one(docs, "Deployment", picker["name"])
    args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--pool-name=loraplex" in args
    # the picker reads the metric names loraplex exports (tests/platform/test_platform_routing.py parses them)
    metrics = dict(a.removeprefix("--").split("=", 1) for a in args)
    assert metrics["lora-info-metric"] == "vllm:lora_requests_info"
    assert metrics["total-queued-requests-metric"] == "vllm:num_requests_waiting"
    assert metrics["kv-cache-usage-percentage-metric"] == "vllm:kv_cache_usage_perc"
    config = yaml.safe_load(_one(docs, "ConfigMap", picker["name"])["data"]["config.yaml"])
    declared = {p["type"] for p in config["plugins"]}
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= declared
    assert "lora-affinity-scorer" in declared
    route = _one(docs, "HTTPRoute", "loraplex")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        "loraplex",
    )


def test_compose_runs_two_replicas_behind_a_load_balancer() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "minio", "minio-bucket", "replica-1", "replica-2", "lb"} <= set(services)
    settings = {f.name for f in dataclasses.fields(Settings)}
    for name in ("replica-1", "replica-2"):
        replica = services[name]
        env = replica["environment"]
        assert (
            env["LORAPLEX_DATABASE_URL"].startswith("postgresql+asyncpg://")
            and "@postgres:5432/" in env["LORAPLEX_DATABASE_URL"]
        )
        assert env["LORAPLEX_REDIS_URL"].startswith("redis://redis:6379/")
        assert all(k.removeprefix("LORAPLEX_").lower() in settings for k in env if k.startswith("LORAPLEX_"))
        # adapter blobs in the S3-compatible store, in a bucket the minio-bucket job creates
        assert parse_blob_url(env["LORAPLEX_BLOB_URL"])[0] == "loraplex-adapters"
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert "mb --ignore-existing store/loraplex-adapters" in services["minio-bucket"]["entrypoint"]
        grace_s = int(replica["stop_grace_period"].removesuffix("s"))
        assert grace_s > float(env["LORAPLEX_DRAIN_TIMEOUT_S"])
        assert set(replica["depends_on"]) == {"postgres", "redis", "minio-bucket"}
        assert "/ready" in " ".join(replica["healthcheck"]["test"])
    nginx = (DEPLOY / "nginx.conf").read_text()
    assert re.findall(r"server (replica-\d):8000", nginx) == ["replica-1", "replica-2"]
    assert "proxy_buffering off" in nginx and "http_503" in nginx  # streams flow; a draining replica's 503 retries
    assert (DEPLOY / "Dockerfile").read_text().count('ENTRYPOINT ["loraplex", "serve"]') == 1
