"""`loraplex adapters import` run as a subprocess against a started server and a local file server: --wait follows
the status resource to the new version, --json prints the resource, refusals exit 3 with their code (the
server's 400s and an import that fails in the background alike)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tests.platform.helpers import create_tenant, eventually, zip_folder
from tests.platform.import_sources import Reply, source_server
from tests.platform.test_platform_cli import cli, get, ok, ok_json, refused

LOCAL = dict(import_allow_networks="127.0.0.1/32", import_allow_http=True, import_retry_base_s=0.05)


def test_adapters_import_waits_for_the_version_and_reports_refusals(start_server, adapter_factory, tmp_path) -> None:
    server = start_server(**LOCAL)
    key = create_tenant(server.url, "cli-import")
    config = tmp_path / "config"

    def run(*args: str):  # type: ignore[no-untyped-def]
        return cli(*args, config=config, url=server.url, key=key)

    archive = zip_folder(adapter_factory("cli-imp-1", seed=111))
    sha = hashlib.sha256(archive).hexdigest()
    with source_server() as files:
        files.routes["/a.zip"] = Reply(200, archive)
        url = f"{files.url}/a.zip"

        out = ok(run("adapters", "import", url, "--name", "remote", "--sha256", sha, "--wait"))
        assert "imported remote version 1 (use remote@1)" in out
        current = get(server.url, key, "/v1/adapters/remote").json()
        assert current["version"] == 1 and current["origin"]["kind"] == "import" and current["origin"]["source"] == url

        status = ok_json(run("adapters", "import", url, "--name", "remote", "--sha256", sha, "--wait", "--json"))
        assert (status["status"], status["version"], status["bytes_done"]) == ("ready", 2, len(archive))

        queued = ok(run("adapters", "import", url, "--name", "later", "--sha256", sha))
        match = re.match(r"import (imp_[0-9a-f]{32}): queued", queued)
        assert match, queued
        later = f"/v1/adapters/later/imports/{match[1]}"
        eventually(lambda: get(server.url, key, later).json()["status"] == "ready", "the queued import is ready")

        # Refused by the route (400) and failed in the background: exit 3, the code on stderr.
        no_sha = refused(run("adapters", "import", url, "--name", "x"))
        assert (no_sha[1], no_sha[2]) == ("invalid_source", "sha256")
        wrong = refused(run("adapters", "import", url, "--name", "x", "--sha256", "0" * 64, "--wait"))
        assert wrong[1] == "checksum_mismatch"
    assert sorted(a["name"] for a in get(server.url, key, "/v1/adapters").json()["data"]) == ["later", "remote"]


def test_import_without_a_server_is_a_usage_error(tmp_path: Path) -> None:
    result = cli("adapters", "import", "hf://org/repo", "--name", "x", config=tmp_path / "config")
    assert result.returncode == 2 and "loraplex login" in result.stderr
