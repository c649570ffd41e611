"""The tenant commands (`loraplex login|adapters|endpoints|batch|usage|keys`, platform/client/) run as
subprocesses against a started server: what each prints, what the API reports after it, the 0600 profile,
`--json` output, and the exit codes (2 usage, 3 refusal, 4 unreachable)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from loraplex.envvars.safe_path import python_module_command
from loraplex.platform.client.adapters import CONFIG_NAME, WEIGHTS_NAME
from loraplex.platform.client.http import Api, ApiError
from loraplex.platform.client.upload import CHUNK, multipart
from tests.platform.helpers import ADMIN_KEY, auth, create_tenant, free_port, upload, zip_folder

ERROR_LINE = re.compile(r"^error (\S+)(?: \(param (\S+)\))?: .+", re.M)


def cli(*args: str, config: Path, url: str | None = None, key: str | None = None) -> subprocess.CompletedProcess:
    """`python -P -m loraplex.platform.cli ARGS` with its own config home; url/key as LORAPLEX_* variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("LORAPLEX_BASE_URL", "LORAPLEX_API_KEY")}
    env["XDG_CONFIG_HOME"] = str(config)
    if url is not None:
        env["LORAPLEX_BASE_URL"] = url
    if key is not None:
        env["LORAPLEX_API_KEY"] = key
    return subprocess.run(
        python_module_command("loraplex.platform.cli", *args),
        env=env,
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def ok_json(result: subprocess.CompletedProcess) -> Any:
    return json.loads(ok(result))


def refused(result: subprocess.CompletedProcess, code: int = 3) -> re.Match:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    match = ERROR_LINE.search(result.stderr)
    assert match, result.stderr
    return match


def get(url: str, key: str, path: str) -> httpx.Response:
    return httpx.get(f"{url}{path}", headers=auth(key), timeout=30)


def test_login_writes_a_private_profile_that_the_commands_use(start_server, tmp_path: Path) -> None:
    server = start_server()
    key = create_tenant(server.url, "cli-login")
    config = tmp_path / "config"

    out = ok_json(
        cli("login", "--base-url", server.url, "--api-key", key, "--tenant", "cli-login", "--json", config=config)
    )
    path = config / "loraplex" / "profile.json"
    assert out["path"] == str(path) and out["tenant"] == "cli-login" and "api_key" not in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    saved = json.loads(path.read_text())["profiles"]["default"]
    assert saved == {"base_url": server.url, "api_key": key, "tenant": "cli-login"}

    # Every command reads it; the LORAPLEX_* variables win over it.
    assert ok_json(cli("adapters", "list", "--json", config=config)) == {"object": "list", "data": []}
    assert ok(cli("adapters", "list", config=config)).strip() == "(none)"
    unreachable = f"http://127.0.0.1:{free_port()}"
    assert refused(cli("adapters", "list", config=config, url=unreachable), 4).group(1) == "unreachable"
    refused(cli("adapters", "list", config=config, key="lpx-0000.not-a-key"))

    # A wrong key is refused at login and saves nothing; a named profile is a second entry.
    refused(cli("login", "--base-url", server.url, "--api-key", "lpx-0000.wrong", "--profile", "bad", config=config))
    assert set(json.loads(path.read_text())["profiles"]) == {"default"}
    ok(cli("login", "--base-url", server.url, "--api-key", key, "--profile", "second", config=config))
    profiles = json.loads(path.read_text())["profiles"]
    assert set(profiles) == {"default", "second"} and profiles["second"]["tenant"] is None  # no adapter to tell
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    missing = cli("adapters", "list", "--profile", "nobody", config=config)
    assert missing.returncode == 2 and "loraplex login" in missing.stderr


def test_adapters_push_versions_rollback_delete(start_server, adapter_factory, tmp_path: Path) -> None:
    server = start_server()
    key = create_tenant(server.url, "cli-adapters")
    config = tmp_path / "config"

    def run(*args: str) -> subprocess.CompletedProcess:
        return cli(*args, config=config, url=server.url, key=key)

    first = ok(run("adapters", "push", str(adapter_factory("cli-1", seed=91)), "--name", "bot"))
    assert "cli-adapters/bot version 1" in first
    second = ok_json(run("adapters", "push", str(adapter_factory("cli-2", seed=92)), "--name", "bot", "--json"))
    assert (second["model"], second["version"]) == ("cli-adapters/bot", 2)
    listed = get(server.url, key, "/v1/adapters").json()["data"]
    assert [(a["model"], a["version"], a["sha256"]) for a in listed] == [("cli-adapters/bot", 2, second["sha256"])]
    assert re.search(r"^bot\s+2\s+cli-adapters/bot\s+ready", ok(run("adapters", "list")), re.M)

    versions = ok_json(run("adapters", "versions", "bot", "--json"))
    assert versions["current"] == 2 and [v["version"] for v in versions["data"]] == [1, 2]
    assert re.search(r"^\*\s+bot\s+2\s", ok(run("adapters", "versions", "bot")), re.M)

    assert "bot now resolves to version 1" in ok(run("adapters", "rollback", "bot", "1"))
    assert get(server.url, key, "/v1/adapters/bot").json()["version"] == 1
    assert get(server.url, key, "/v1/adapters/bot/versions").json()["current"] == 1

    ok(run("adapters", "delete", "bot@2"))
    assert [v["version"] for v in get(server.url, key, "/v1/adapters/bot/versions").json()["data"]] == [1]
    assert refused(run("adapters", "delete", "bot@2")).group(1) == "adapter_not_found"
    assert refused(run("adapters", "rollback", "bot", "5")).group(1) == "adapter_not_found"

    # login finds the tenant from its adapters when --tenant is left out.
    ok(cli("login", "--base-url", server.url, "--api-key", key, config=config))
    assert json.loads((config / "loraplex" / "profile.json").read_text())["profiles"]["default"]["tenant"] == (
        "cli-adapters"
    )

    ok(run("adapters", "delete", "bot"))
    assert get(server.url, key, "/v1/adapters").json()["data"] == []
    assert refused(run("adapters", "delete", "bot")).group(1) == "adapter_not_found"

    # A folder that is no PEFT adapter is the user's to fix (2); nothing is sent.
    not_adapter = tmp_path / "empty"
    not_adapter.mkdir()
    result = run("adapters", "push", str(not_adapter), "--name", "x")
    assert result.returncode == 2 and CONFIG_NAME in result.stderr


def test_push_may_accept_a_failed_check(start_server, adapter_factory, wrong_scale, tmp_path: Path) -> None:
    server = start_server()
    key = create_tenant(server.url, "cli-accept")
    folder = adapter_factory("cli-accept", seed=95)

    def run(*args: str) -> subprocess.CompletedProcess:
        return cli(*args, config=tmp_path / "config", url=server.url, key=key)

    assert refused(run("adapters", "push", str(folder), "--name", "bent")).groups() == ("adapter_check_failed", "name")
    assert get(server.url, key, "/v1/adapters").json()["data"] == []
    pushed = ok_json(run("adapters", "push", str(folder), "--name", "bent", "--accept-failed-check", "--json"))
    assert pushed["version"] == 1 and pushed["publish_check"]["passed"] is False
    assert pushed["publish_check"]["accepted_with_warning"] is True


def test_adapters_merge_publishes_a_version_that_records_its_sources(start_server, adapter_factory, tmp_path) -> None:
    server = start_server()
    key = create_tenant(server.url, "cli-merge")
    for name, seed in (("a", 61), ("b", 62)):
        assert upload(
            server.url, key, name, archive=zip_folder(adapter_factory(f"cli-merge-{name}", seed=seed))
        ).is_success

    def run(*args: str) -> subprocess.CompletedProcess:
        return cli(*args, config=tmp_path / "config", url=server.url, key=key)

    out = ok_json(
        run("adapters", "merge", "ab", "--source", "a@1:0.7", "--source", "b:0.3", "--method", "linear", "--json")
    )
    assert (out["name"], out["version"]) == ("ab", 1)
    assert out["origin"]["method"] == "linear"
    assert [(s["name"], s["version"], s["weight"]) for s in out["origin"]["sources"]] == [("a", 1, 0.7), ("b", 1, 0.3)]
    listed = get(server.url, key, "/v1/adapters/ab").json()
    assert listed["sha256"] == out["sha256"] and listed["origin"] == out["origin"]
    human = ok(run("adapters", "merge", "ab", "--source", "a", "--source", "b", "--method", "svd", "--svd-rank", "2"))
    assert "merged a@1 x1.0, b@1 x1.0 (svd) into cli-merge/ab version 2" in human

    assert refused(run("adapters", "merge", "ab", "--source", "a", "--source", "nope", "--method", "cat")).group(1) == (
        "adapter_not_found"
    )
    assert run("adapters", "merge", "ab", "--source", "a", "--method", "cat").returncode == 2  # one source
    assert (
        "is not a number"
        in run("adapters", "merge", "ab", "--source", "a:x", "--source", "b", "--method", "cat").stderr
    )
    assert run("adapters", "merge", "ab", "--source", "a", "--source", "b", "--method", "mean").returncode == 2


def test_endpoints_create_split_promote_rollback(start_server, adapter_factory, tmp_path: Path) -> None:
    server = start_server()
    key = create_tenant(server.url, "cli-endpoints")
    for i in (1, 2):
        assert (
            upload(server.url, key, "bot", archive=zip_folder(adapter_factory(f"cli-{i}", seed=90 + i))).status_code
            == 201
        )

    def run(*args: str) -> subprocess.CompletedProcess:
        return cli(*args, config=tmp_path / "config", url=server.url, key=key)

    def endpoint() -> dict[str, Any]:
        return get(server.url, key, "/v1/endpoints/extract").json()

    made = ok_json(
        run(
            "endpoints",
            "create",
            "extract",
            "--adapter",
            "bot@1",
            "--defaults",
            '{"max_tokens": 4}',
            "--description",
            "Invoices: who & how much",
            "--json",
        )
    )
    assert (made["revision"], made["adapter"], made["canary"], made["defaults"], made["description"]) == (
        1,
        "bot@1",
        None,
        {"max_tokens": 4},
        "Invoices: who & how much",
    )
    assert re.search(r"\sInvoices: who & how much\s*$", ok(run("endpoints", "show", "extract")), re.M)
    assert re.search(r"^extract\s+2\s+bot@1\s+v2 at 0.3\s", ok(run("endpoints", "split", "extract", "2", "0.3")), re.M)
    assert endpoint()["canary"] == {"version": 2, "weight": 0.3}
    ok(run("endpoints", "promote", "extract"))
    assert (endpoint()["adapter"], endpoint()["canary"]) == ("bot@2", None)
    ok(run("endpoints", "split", "extract", "1", "0.5"))
    assert endpoint()["canary"] == {"version": 1, "weight": 0.5}
    ok(run("endpoints", "rollback", "extract"))
    assert (endpoint()["adapter"], endpoint()["canary"]) == ("bot@2", None)
    shown = ok_json(run("endpoints", "show", "extract", "--json"))
    assert shown == endpoint()
    assert [e["name"] for e in ok_json(run("endpoints", "list", "--json"))["data"]] == ["extract"]

    assert refused(run("endpoints", "rollback", "extract")).group(1) == "no_canary"
    assert refused(run("endpoints", "split", "extract", "7", "0.5")).groups() == ("adapter_not_found", "canary.version")
    bad_weight = run("endpoints", "split", "extract", "2", "1.5")
    assert bad_weight.returncode == 2 and "weight" in bad_weight.stderr
    assert endpoint()["revision"] == 5  # create, split, promote, split, rollback: the refusals changed nothing


def test_batch_submit_waits_and_downloads_output_and_errors(start_server, tmp_path: Path) -> None:
    server = start_server()
    key = create_tenant(server.url, "cli-batch")
    model = get(server.url, key, "/v1/models").json()["data"][0]["id"]
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model if i != 2 else "no-such-model",
                "messages": [{"role": "user", "content": f"hi {i}"}],
                "max_tokens": 2,
            },
        }
        for i in range(5)
    ]
    job = tmp_path / "job.jsonl"
    job.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out_dir = tmp_path / "results"

    result = cli(
        "batch",
        "submit",
        str(job),
        "--endpoint",
        "chat",
        "--wait",
        "--output-dir",
        str(out_dir),
        "--json",
        config=tmp_path / "config",
        url=server.url,
        key=key,
    )
    batch = ok_json(result)
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    output = Path(batch["downloaded"]["output"]).read_text().splitlines()
    errors = Path(batch["downloaded"]["errors"]).read_text().splitlines()
    assert Path(batch["downloaded"]["output"]).parent == out_dir
    assert [json.loads(x)["custom_id"] for x in output] == ["req-0", "req-1", "req-3", "req-4"]
    assert [json.loads(x)["response"]["status_code"] for x in errors] == [404]

    human = ok(cli("batch", "status", batch["id"], config=tmp_path / "config", url=server.url, key=key))
    assert f"batch {batch['id']}: completed (4 completed, 1 failed of 5)" in human
    # A line the server refuses at upload is its refusal, named by line (3).
    job.write_text('{"custom_id": "a"}\n')
    assert refused(cli("batch", "submit", str(job), config=tmp_path / "config", url=server.url, key=key))


def test_usage_and_keys_rotate(start_server, tmp_path: Path) -> None:
    server = start_server()
    old = create_tenant(server.url, "cli-keys", tokens_per_minute=1000)
    config = tmp_path / "config"
    ok(cli("login", "--base-url", server.url, "--api-key", old, config=config))  # no adapter: tenant unknown
    unknown = cli("usage", config=config)
    assert unknown.returncode == 2 and "--tenant" in unknown.stderr

    use = ok_json(cli("usage", "--tenant", "cli-keys", "--json", config=config))
    assert use["tokens_per_minute"] == 1000 and use["tokens_this_minute"] == 0
    assert refused(cli("usage", "--tenant", "someone-else", config=config)).group(1) == "tenant_not_found"

    rotated = ok_json(cli("keys", "rotate", "--tenant", "cli-keys", "--json", config=config))
    new = json.loads((config / "loraplex" / "profile.json").read_text())["profiles"]["default"]["api_key"]
    assert new != old and "key" not in rotated["new"] and rotated["revoked"]["revoked_at"] is not None
    assert get(server.url, old, "/v1/models").status_code == 401
    assert get(server.url, new, "/v1/models").status_code == 200
    assert refused(cli("adapters", "list", config=config, key=old)).group(1) is not None

    # The profile now holds the new key and the tenant: usage and keys need no --tenant.
    table = ok(cli("usage", config=config))
    assert re.search(r"^tokens_this_minute\s+0\s+1000$", table, re.M)
    keys = ok_json(cli("keys", "list", "--json", config=config))["data"]
    assert sorted(k["revoked_at"] is None for k in keys) == [False, True]

    # With the key from LORAPLEX_API_KEY, the new key is printed once (there is no profile to keep it).
    printed = ok(cli("keys", "rotate", "--tenant", "cli-keys", config=tmp_path / "other", url=server.url, key=new))
    assert get(server.url, new, "/v1/models").status_code == 401
    newest = re.search(r"lpx-\S+\.\S+", printed)
    assert newest and get(server.url, newest.group(0), "/v1/models").status_code == 200


def test_tenants_create_logs_in_and_chat_answers_held_to_a_schema(start_server, tmp_path: Path) -> None:
    """The newcomer's commands: `tenants create --login` with the admin key, then `chat --schema`."""
    server = start_server()
    config = tmp_path / "config"
    assert "--admin-key" in cli("tenants", "create", "cli-new", "--base-url", server.url, config=config).stderr
    wrong = cli(
        "tenants", "create", "cli-new", "--base-url", server.url, "--admin-key", "lpx-admin.wrong", config=config
    )
    assert refused(wrong).group(1) == "invalid_api_key"
    assert not (config / "loraplex" / "profile.json").exists()

    created = ok(
        cli(
            "tenants", "create", "cli-new", "--base-url", server.url, "--admin-key", ADMIN_KEY, "--login", config=config
        )
    )
    saved = json.loads((config / "loraplex" / "profile.json").read_text())["profiles"]["default"]
    assert saved["tenant"] == "cli-new" and saved["base_url"] == server.url and saved["api_key"] not in created
    assert get(server.url, saved["api_key"], "/v1/models").status_code == 200
    assert (
        refused(cli("tenants", "create", "cli-new", "--admin-key", ADMIN_KEY, config=config)).group(1)
        == "tenant_exists"
    )

    model = get(server.url, saved["api_key"], "/v1/models").json()["data"][0]["id"]
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    answered = cli(
        "chat", model, "Is it fine?", "--schema", str(tmp_path / "schema.json"), "--max-tokens", "32", config=config
    )
    assert json.loads(ok(answered)) in ({"ok": True}, {"ok": False})  # the tiny random model: either, never other
    assert "schema: exact" in answered.stderr
    full = ok_json(
        cli("chat", model, "hi", "--schema", json.dumps(schema), "--field-logprobs", "--json", config=config)
    )
    assert set(full["choices"][0]["field_logprobs"]) == {"/ok"}

    assert "not JSON" in cli("chat", model, "hi", "--schema", "{oops", config=config).stderr
    assert "cannot read" in cli("chat", model, "hi", "--schema", str(tmp_path / "none.json"), config=config).stderr
    assert cli("chat", model, "hi", "--field-logprobs", config=config).returncode == 2
    assert refused(cli("chat", "no-such-model", "hi", config=config)).group(1) == "model_not_found"


def test_exit_codes_for_usage_errors_and_an_unreachable_server(tmp_path: Path) -> None:
    config = tmp_path / "config"
    unreachable = f"http://127.0.0.1:{free_port()}"
    assert cli("adapters", config=config).returncode == 2  # argparse: a sub-command is required
    assert cli("adapters", "rollback", "bot", "one", config=config, url=unreachable, key="k").returncode == 2
    assert cli("endpoints", "create", "e", "--defaults", "[1]", config=config, url=unreachable, key="k").returncode == 2
    assert cli("adapters", "list", config=config).returncode == 2  # no profile, no variables
    for args in (
        ("adapters", "list"),
        ("usage", "--tenant", "t"),
        ("login", "--base-url", unreachable, "--api-key", "k"),
    ):
        assert refused(cli(*args, config=config, url=unreachable, key="k"), 4).group(1) == "unreachable"
    assert not (config / "loraplex" / "profile.json").exists()


def test_push_streams_the_form_and_names_the_files_loraplex_adapters_reads(tmp_path: Path) -> None:
    from loraplex.adapters import files

    assert (CONFIG_NAME, WEIGHTS_NAME) == (files.CONFIG_NAME, files.WEIGHTS_NAME)
    data = os.urandom(2 * CHUNK + 5)
    (tmp_path / "a.zip").write_bytes(data)
    headers, body = multipart({"name": "bot"}, "file", "a.zip", tmp_path / "a.zip", desc="test")
    chunks = list(body)
    assert len(chunks) == 5  # the form's head, three chunks of the file, the closing boundary
    joined = b"".join(chunks)
    assert int(headers["Content-Length"]) == len(joined) and data in joined
    boundary = headers["Content-Type"].split("boundary=")[1]
    assert joined.endswith(f"--{boundary}--\r\n".encode()) and b'name="name"\r\n\r\nbot\r\n' in joined


@pytest.mark.parametrize(
    ("status", "body", "exit_code", "line"),
    [
        (
            404,
            {"error": {"message": "m", "type": "t", "param": None, "code": "adapter_not_found"}},
            3,
            "error adapter_not_found: m",
        ),
        (400, {"error": {"message": "m", "type": "t", "param": "name", "code": "bad"}}, 3, "error bad (param name): m"),
        (
            503,
            {"error": {"message": "draining", "type": "t", "param": None, "code": "unavailable"}},
            4,
            "error unavailable: draining",
        ),
        (502, None, 4, "error http_502: bad gateway"),
    ],
)
def test_api_errors_map_to_exit_codes(status: int, body: Any, exit_code: int, line: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body) if body else httpx.Response(status, text="bad gateway")

    api = Api("http://server", "k")
    api.client = httpx.Client(base_url=api.base_url, transport=httpx.MockTransport(answer))
    with pytest.raises(ApiError) as raised:
        api.json("GET", "/v1/adapters")
    assert (raised.value.exit_code, str(raised.value)) == (exit_code, line)
