"""The README's own path, end to end: its first command (`.venv/bin/loraplex serve` from the checkout, the bundled
SmolLM2, default settings, warm-up on; only a free port and a fresh `LORAPLEX_DATA_DIR`), readiness on `/ready`,
the generated admin key it prints, the README's curl commands (read out of README.md, so the test breaks when the
README drifts) to create a tenant, upload a zipped PEFT adapter and ask it for a JSON-schema constrained answer, then
the same through the official `openai` client, each answer checked with `jsonschema`. And the newcomer's path with
the `loraplex` commands only (the README's own lines: create the tenant and log in, push the adapter folder, ask
for the constrained answer), timed from the server's start to that first answer."""

from __future__ import annotations

import json
import os
import re
import shlex
import string
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from tests.platform.helpers import ServerProcess, make_peft_adapter, zip_folder
from tests.platform.test_platform_smollm2 import PERSON

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_commands() -> list[str]:
    """Every command of the README's bash blocks, continuation lines joined, comments left on (a quoted argument
    that spans lines, such as a JSON body, stays in its command)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            pending = f"{pending}\n{line}" if pending else line
            try:
                shlex.split(pending, comments=True)
            except ValueError:  # a quote still open: the command goes on
                continue
            if pending.strip():
                commands.append(pending.strip())
            pending = ""
        assert not pending, f"README: a bash command with an unclosed quote: {pending!r}"
    return commands


def first_serve_command() -> list[str]:
    """The README's first command is `set-up && serve`: the serve part, as shell words."""
    words = shlex.split(readme_commands()[0], comments=True)
    assert "&&" in words and words[words.index("&&") + 1 :][-1] == "serve", words
    return words[words.index("&&") + 1 :]


@dataclass
class Curl:
    method: str = "GET"
    path: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    data: str | None = None
    form: dict[str, str] = field(default_factory=dict)


def readme_curl(path: str) -> Curl:
    """The README's curl command to `localhost:8000<path>`, parsed (an option it does not know fails the test)."""
    for command in readme_commands():
        words = shlex.split(command, comments=True)
        if words[:1] == ["curl"] and f"localhost:8000{path}" in words:
            break
    else:
        raise AssertionError(f"README.md has no curl command for {path}")
    curl, rest = Curl(), iter(words[1:])
    for word in rest:
        if word == "-s":
            continue
        if word in ("-X", "-H", "-d", "-F"):
            value = next(rest)
            if word == "-X":
                curl.method = value
            elif word == "-H":
                name, _, header = value.partition(":")
                curl.headers[name.strip()] = header.strip()
            elif word == "-d":
                curl.data = value
            else:
                name, _, form = value.partition("=")
                curl.form[name] = form
        else:
            assert word.startswith("localhost:8000/"), f"README's curl: unknown word {word!r}"
            curl.path = word.removeprefix("localhost:8000")
    if "-X" not in words and (curl.data is not None or curl.form):
        curl.method = "POST"  # as curl does with a body
    return curl


def send(curl: Curl, url: str, files: dict[str, bytes] | None = None, **variables: str) -> httpx.Response:
    """Send `curl` to the server at `url` the way curl does, `$NAME`s in its headers taken from `variables`
    (`-d` without a Content-Type header is sent as curl sends it: application/x-www-form-urlencoded)."""
    headers = {k: string.Template(v).substitute(variables) for k, v in curl.headers.items()}
    if curl.data is not None:
        headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
    fields = {k: v for k, v in curl.form.items() if not v.startswith("@")}
    uploads = {k: (v[1:], (files or {})[v[1:]]) for k, v in curl.form.items() if v.startswith("@")}
    return httpx.request(
        curl.method,
        url + curl.path,
        headers=headers,
        content=curl.data,
        data=fields or None,
        files=uploads or None,
        timeout=120,
    )


@pytest.fixture
def readme_server(tmp_path: Path) -> Iterator[ServerProcess]:
    started = time.monotonic()
    server = ServerProcess(
        [],
        # empty is unset: the admin key is the one it generates and prints, as for someone following the README
        {"LORAPLEX_DATA_DIR": str(tmp_path / "data"), "LORAPLEX_ADMIN_KEY": ""},
        tmp_path / "serve.log",
        command=first_serve_command(),
        cwd=ROOT,
        warmup=True,
    )
    server.started = started  # type: ignore[attr-defined]  # when the README's first command ran
    try:
        yield server.wait_ready(timeout=600)  # liveness bound: model load, C kernels, warm-up on 2 shared cores
    finally:
        server.stop()


def printed_admin_key(server: ServerProcess) -> str:
    printed = re.search(r"generated admin key[^:]*:\s*(\S+)", server.log.read_text())
    assert printed, server.log.read_text()[-3000:]
    return printed.group(1)


def readme_cli_commands() -> list[list[str]]:
    """The README's `loraplex` tenant commands (the CLI path), as shell words."""
    found = [shlex.split(c, comments=True) for c in readme_commands()]
    return [w for w in found if w[:1] == [".venv/bin/loraplex"] and w[1:2] != ["serve"]]


def test_the_readme_path_serves_a_tenants_adapter_with_schema_constrained_output(
    readme_server: ServerProcess, smol_dir: Path, tmp_path: Path
) -> None:
    url = readme_server.url
    admin_key = printed_admin_key(readme_server)

    r = send(readme_curl("/v1/tenants"), url, ADMIN_KEY=admin_key)
    assert r.status_code == 201, r.text
    tenant_key = r.json()["api_key"]["key"]

    upload = readme_curl("/v1/adapters")
    archive = upload.form["file"].removeprefix("@")
    folder = make_peft_adapter(smol_dir, tmp_path / "adapter")
    r = send(upload, url, files={archive: zip_folder(folder)}, TENANT_KEY=tenant_key)
    assert r.status_code == 201, r.text
    model = r.json()["model"]

    r = send(readme_curl("/v1/chat/completions"), url, TENANT_KEY=tenant_key)  # the README's constrained request
    assert r.status_code == 200, r.text
    asked = json.loads(readme_curl("/v1/chat/completions").data or "")
    assert asked["model"] == model and r.json()["model"] == model
    schema = asked["response_format"]["json_schema"]["schema"]
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), schema)

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=tenant_key, max_retries=0, timeout=300)
    out = client.chat.completions.create(
        model=model,
        temperature=0,
        max_tokens=80,
        messages=[{"role": "user", "content": "Anna is 31 and lives in Rome. Give her details as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    assert out.model == model and out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)


def test_a_newcomer_reaches_a_constrained_answer_with_the_readme_cli_commands_only(
    readme_server: ServerProcess, smol_dir: Path, tmp_path: Path
) -> None:
    """The README's CLI lines, run as written from a folder holding `./support-bot` and `person.json` (the schema of
    the README's curl request): `$ADMIN_KEY` is the key the server printed, its URL the started server's. The
    seconds each step took are recorded (`timings.json` beside the test's files; no bound is asserted)."""
    words = readme_cli_commands()
    assert [w[1:3] for w in words] == [["tenants", "create"], ["adapters", "push"], ["chat", "acme/support-bot"]]
    work = tmp_path / "newcomer"
    work.mkdir()
    make_peft_adapter(smol_dir, work / "support-bot")
    asked = json.loads(readme_curl("/v1/chat/completions").data or "")
    schema = asked["response_format"]["json_schema"]["schema"]
    (work / "person.json").write_text(json.dumps(schema))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # a newcomer's empty profile
    admin_key = printed_admin_key(readme_server)
    timings = {"serve ready": time.monotonic() - readme_server.started}  # type: ignore[attr-defined]
    outputs = []
    for command in words:
        argv = [str(ROOT / command[0])] + [
            readme_server.url if w == "http://localhost:8000" else admin_key if w == "$ADMIN_KEY" else w
            for w in command[1:]
        ]
        begun = time.monotonic()
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        timings[" ".join(command[1:3])] = time.monotonic() - begun
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        outputs.append(done)
    timings["total"] = time.monotonic() - readme_server.started  # type: ignore[attr-defined]
    (tmp_path / "timings.json").write_text(json.dumps(timings, indent=2))
    print("newcomer's path, seconds:", json.dumps({k: round(v, 1) for k, v in timings.items()}))
    created, pushed, answered = outputs
    assert "key is saved in profile" in created.stdout and admin_key not in created.stdout
    assert "acme/support-bot" in pushed.stdout
    jsonschema.validate(json.loads(answered.stdout), schema)
    # how the schema was enforced, from the x-loraplex-schema headers (the integer is narrowed to 16 digits)
    assert re.search(r"^schema: narrowed \(\[.*at /properties/age", answered.stderr, re.M), answered.stderr
