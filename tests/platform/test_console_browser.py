"""The web console in a real browser: headless Chromium (Debian's, driven by Selenium) against a server started
here with the real SmolLM2 engine and real PEFT adapters for it. Journeys: a wrong key stays on sign-in; sign-in
keeps the key out of localStorage, cookies and the URL; upload an adapter with progress and see it listed; roll
back; a 90/10 canary whose two versions both show on the plot after calls; promote and the slider; delete refused
with its reason; a batch submitted and its output downloaded; the playground's JSON, schema header, grounded
spans and field confidence; hostile strings rendered as text with no dialog and no CSP violation. Screenshots of
each page are saved under the test's temp folder."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loraplex.platform.model_resolution import canary_share
from tests.platform.browser import require_browser, start_chromium, wait_for
from tests.platform.conftest import settings_for
from tests.platform.helpers import ServerThread, auth, create_tenant, make_peft_adapter, upload, zip_folder
from tests.platform.import_sources import Reply, source_server

pytestmark = pytest.mark.slow

TENANT = "console-tenant"
HOSTILE_NAME = "<img src=x onerror=alert(1)>"
HOSTILE_PROMPT = "<script>window.__pwned = 1; alert('endpoint')</script>"
HOSTILE_DESCRIPTION = "<script>window.__pwned = 2; alert('description')</script><b onmouseover=alert(2)>x</b>"


@pytest.fixture(scope="module")
def console(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server on SmolLM2 with one tenant, two real adapters for the model (zips), and a browser."""
    require_browser()
    from loraplex.engine import AsyncEngine, EngineArgs

    root = tmp_path_factory.mktemp("console")
    engine = AsyncEngine(
        EngineArgs(max_model_len=1024, kv_cache_bytes=256 * 1024 * 1024, max_num_seqs=16, max_loras=2, max_cpu_loras=4)
    )
    settings = settings_for(
        "sqlite",
        root / "data",
        max_upload_bytes=64 * 1024 * 1024,
        endpoint_rollup_flush_s=1.0,
        import_allow_networks="127.0.0.1/32",  # the import journey's source server, on this machine
        import_allow_http=True,
    )
    server = ServerThread(create_app_for(settings, engine)).start()
    key = create_tenant(server.url, TENANT)
    zips = []
    for seed in (1, 2):
        folder = make_peft_adapter(smol_dir, root / f"lora-{seed}", r=4, seed=seed, targets=("q_proj", "v_proj"))
        path = root / f"lora-{seed}.zip"
        path.write_bytes(zip_folder(folder))
        zips.append(path)
    downloads = root / "downloads"
    downloads.mkdir()
    driver = start_chromium(root / "profile", downloads)
    shots = root / "screenshots"
    shots.mkdir()
    try:
        yield dict(server=server, key=key, zips=zips, driver=driver, downloads=downloads, shots=shots, engine=engine)
    finally:
        driver.quit()
        server.stop()
        engine.shutdown()


def create_app_for(settings: Any, engine: Any) -> Any:
    from loraplex.platform.app import create_app

    return create_app(settings, engine=engine)


def by(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def all_by(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def text_of(driver: Any, css: str) -> str:
    found = all_by(driver, css)
    return found[0].text if found else ""


def open_console(c: dict[str, Any], hash_: str = "") -> Any:
    driver = c["driver"]
    driver.get(f"{c['server'].url}/console/{hash_}")
    wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete", "the page to load")
    return driver


def sign_in(c: dict[str, Any], key: str | None = None) -> Any:
    driver = open_console(c)
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    by(driver, "#tenant").send_keys(TENANT)
    by(driver, "#api-key").send_keys(key or c["key"])
    by(driver, "#sign-in-button").click()
    return driver


def shot(c: dict[str, Any], name: str) -> None:
    c["driver"].save_screenshot(str(c["shots"] / f"{name}.png"))


def assert_clean(driver: Any) -> None:
    """No dialog opened, no CSP violation, nothing a hostile string could have run."""
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018  (reading it is what raises)
    assert driver.execute_script("return window.__cspViolations") == 0, driver.execute_script(
        "return window.__cspReports"
    )
    assert driver.execute_script("return window.__pwned") is None


def test_a_wrong_key_stays_on_the_sign_in_page(console: dict[str, Any]) -> None:
    driver = sign_in(console, key="lpx-0123456789abcdef.not-a-real-key")
    wait_for(driver, lambda d: "Not signed in" in text_of(d, "#sign-in-error"), "the sign-in error")
    assert "401" in text_of(driver, "#sign-in-error") or "key" in text_of(driver, "#sign-in-error").lower()
    assert by(driver, "#sign-in").is_displayed() and not by(driver, "#nav").is_displayed()
    assert driver.execute_script("return sessionStorage.length") == 0
    shot(console, "sign-in-refused")
    assert_clean(driver)


def test_sign_in_upload_list_and_roll_back(console: dict[str, Any]) -> None:
    c = console
    driver = sign_in(c)
    wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "the signed-in navigation")
    # the key: in this tab's sessionStorage only
    assert driver.execute_script("return sessionStorage.getItem('loraplex.key')") == c["key"]
    assert c["key"] not in driver.execute_script("return JSON.stringify(localStorage)")
    assert c["key"] not in driver.current_url and c["key"] not in driver.execute_script("return document.cookie")
    assert driver.execute_script("return localStorage.length") == 0

    for n, path in enumerate(c["zips"], start=1):
        by(driver, "#upload-name").send_keys("bot")
        by(driver, "#upload-file").send_keys(str(path))
        by(driver, "#upload-button").click()
        wait_for(driver, lambda d, n=n: f"version {n}" in text_of(d, "#upload-status"), f"upload {n} to finish")
        progress = by(driver, "#upload-progress")
        assert float(progress.get_attribute("value")) == float(progress.get_attribute("max")) > 0
    row = "#adapters tr[data-adapter='bot']"
    wait_for(driver, lambda d: "v2" in text_of(d, row), "bot at v2 in the list")
    assert f"{TENANT}/bot" in text_of(driver, row)
    shot(c, "adapters")

    by(driver, "#adapters tr[data-adapter='bot'] a").click()
    wait_for(driver, lambda d: all_by(d, "#versions tr[data-version='1'] [data-action='make-current']"), "versions")
    by(driver, "#versions tr[data-version='1'] [data-action='make-current']").click()
    wait_for(driver, lambda d: "v1 is now current" in text_of(d, "#versions-status"), "the rollback")
    wait_for(driver, lambda d: "(current)" in text_of(d, "#versions tr[data-version='1']"), "v1 marked current")
    assert httpx.get(f"{c['server'].url}/v1/adapters/bot", headers=auth(c["key"])).json()["version"] == 1
    shot(c, "adapter-versions")
    assert_clean(driver)


def test_import_by_reference(console: dict[str, Any]) -> None:
    c = console
    archive = c["zips"][1].read_bytes()
    with source_server() as files:
        files.routes["/lora.zip"] = Reply(200, archive)
        driver = sign_in(c)
        wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "signed in")
        wait_for(driver, lambda d: all_by(d, "#import-form"), "the import form")
        by(driver, "#import-name").send_keys("imported")
        by(driver, "#import-source").send_keys(f"{files.url}/lora.zip")
        by(driver, "#import-sha256").send_keys(hashlib.sha256(archive + b"!").hexdigest())  # a wrong checksum
        by(driver, "#import-button").click()
        wait_for(driver, lambda d: "checksum_mismatch" in text_of(d, "#import-status"), "the failed import's reason")
        by(driver, "#import-sha256").clear()
        by(driver, "#import-sha256").send_keys(hashlib.sha256(archive).hexdigest())
        by(driver, "#import-button").click()
        wait_for(driver, lambda d: "Imported imported version 1" in text_of(d, "#import-status"), "the import")
        wait_for(driver, lambda d: "v1" in text_of(d, "#adapters tr[data-adapter='imported']"), "it listed")
        assert files.paths() == ["/lora.zip", "/lora.zip"]
    assert_clean(driver)


def _users_for(endpoint_id: str, canary_weight: float, main: int, canary: int) -> list[tuple[str, int]]:
    """Sticky keys that land `main` callers on the main version and `canary` on the canary (and which is which)."""
    picked: list[tuple[str, int]] = []
    counts = Counter[int]()
    i = 0
    while counts[1] < main or counts[2] < canary:
        user = f"caller-{i}"
        version = 2 if canary_share(endpoint_id, user) < canary_weight else 1
        if counts[version] < (canary if version == 2 else main):
            picked.append((user, version))
            counts[version] += 1
        i += 1
    return picked


def test_canary_endpoint_plot_promote_and_slider(console: dict[str, Any]) -> None:
    c = console
    url, key = c["server"].url, c["key"]
    for path in c["zips"]:  # versions of `canary-bot` (independent of the upload journey's `bot`)
        assert upload(url, key, "canary-bot", archive=path.read_bytes()).status_code == 201
    driver = sign_in(c)
    wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "signed in")
    driver.get(f"{url}/console/#/endpoints")
    wait_for(driver, lambda d: all_by(d, "#create-endpoint"), "the endpoints page")
    for css, value in [
        ("#ep-name", "support"),
        ("#ep-adapter", "canary-bot@1"),
        ("#ep-system", "You answer support tickets."),
        ("#ep-max-tokens", "4"),
        ("#ep-canary-version", "2"),
    ]:
        by(driver, css).send_keys(value)
    weight = by(driver, "#ep-canary-weight")
    weight.clear()
    weight.send_keys("10")
    by(driver, "#create-button").click()
    listed = "#endpoints tr[data-endpoint='support']"
    wait_for(driver, lambda d: "canary v2 10%" in text_of(d, listed), "the endpoint listed with its canary")
    shot(c, "endpoints")
    endpoint = httpx.get(f"{url}/v1/endpoints/support", headers=auth(key)).json()
    assert endpoint["canary"] == {"version": 2, "weight": 0.1} and endpoint["adapter"] == "canary-bot@1"

    callers = _users_for(endpoint["id"], 0.1, main=6, canary=3)
    served = Counter[int]()
    for user, expected in callers:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "support", "messages": [{"role": "user", "content": "My order is late."}], "user": user},
            headers=auth(key),
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-loraplex-served-by"] == f"canary-bot@{expected}"
        served[expected] += 1

    by(driver, "#endpoints tr[data-endpoint='support'] a").click()
    wait_for(driver, lambda d: all_by(d, "svg[data-plot='requests']"), "the plots")

    def plotted(d: Any) -> dict[str, float] | None:
        values: dict[str, float] = {}
        for version in ("1", "2"):
            dots = all_by(d, f"svg[data-plot='requests'] circle[data-series='{version}']")
            values[version] = sum(float(dot.get_attribute("data-value")) for dot in dots)
        return values if values == {"1": served[1], "2": served[2]} else None

    wait_for(driver, plotted, f"both versions' calls on the plot ({dict(served)})", timeout=30)
    assert len(all_by(driver, "svg[data-plot='requests'] polyline")) == 2
    assert len(all_by(driver, "svg[data-plot='latency'] polyline")) == 2
    # (the charts are redrawn every 5 s: each read below is retried if it lands on a replaced element)
    wait_for(driver, lambda d: text_of(d, "#version-totals tr[data-version='1'] .requests") == str(served[1]), "v1")
    wait_for(driver, lambda d: text_of(d, "#version-totals tr[data-version='2'] .errors") == "0", "v2's errors")
    legend = "svg[data-plot='requests'] text.legend"
    wait_for(driver, lambda d: [t.text for t in all_by(d, legend)] == ["v1", "v2"], "the legend")
    shot(c, "endpoint")

    # deleting a version the endpoint serves is refused, and the console shows why
    driver.get(f"{url}/console/#/adapters/canary-bot")
    wait_for(driver, lambda d: all_by(d, "#versions tr[data-version='2'] [data-action='delete-version']"), "versions")
    by(driver, "#versions tr[data-version='2'] [data-action='delete-version']").click()
    wait_for(driver, lambda d: "support" in text_of(d, "#versions-status"), "the refusal naming the endpoint")
    assert by(driver, "#versions-status").get_attribute("class") == "error"
    assert all_by(driver, "#versions tr[data-version='2']")  # still there

    # promote, then a new canary through the version box and the slider (keyboard: 5 steps of 1%)
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{url}/console/#/endpoints/support")
    wait_for(driver, lambda d: all_by(d, "#promote:not([disabled])"), "the promote button")
    by(driver, "#promote").click()
    wait_for(driver, lambda d: "canary promoted" in text_of(d, "#endpoint-status"), "the promotion")
    assert text_of(driver, "#serves") == "canary-bot@2"
    by(driver, "#canary-version").send_keys("1")
    slider = by(driver, "#canary-weight")
    slider.send_keys(Keys.HOME)
    for _ in range(5):
        slider.send_keys(Keys.ARROW_RIGHT)
    wait_for(driver, lambda d: "canary at 5%" in text_of(d, "#endpoint-status"), "the slider's change")
    after = httpx.get(f"{url}/v1/endpoints/support", headers=auth(key)).json()
    assert after["adapter"] == "canary-bot@2" and after["canary"] == {"version": 1, "weight": 0.05}
    # a shadow the same way: v1 gets a copy of 3% of the calls
    by(driver, "#shadow-version").send_keys("1")
    shadow = by(driver, "#shadow-fraction")
    for _ in range(3):
        shadow.send_keys(Keys.ARROW_RIGHT)
    wait_for(driver, lambda d: "shadow at 3%" in text_of(d, "#endpoint-status"), "the shadow slider's change")
    after = httpx.get(f"{url}/v1/endpoints/support", headers=auth(key)).json()
    assert after["shadow"] == {"version": 1, "fraction": 0.03} and after["canary"] == {"version": 1, "weight": 0.05}
    wait_for(driver, lambda d: "shadow v1 3%" in text_of(d, "#split"), "the split line")
    assert_clean(driver)


def test_batch_submitted_and_output_downloaded(console: dict[str, Any]) -> None:
    c = console
    url = c["server"].url
    driver = sign_in(c)
    wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "signed in")
    driver.get(f"{url}/console/#/batches")
    wait_for(driver, lambda d: all_by(d, "#batch-form"), "the batch page")
    base = c["engine"].model_name
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": base, "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 4},
        }
        for i in range(3)
    ]
    lines.append({**lines[0], "custom_id": "bad", "body": {**lines[0]["body"], "model": "no-such-model"}})
    by(driver, "#batch-lines").send_keys("\n".join(json.dumps(line) for line in lines))
    by(driver, "#batch-metadata").send_keys(HOSTILE_NAME)
    by(driver, "#batch-submit").click()
    wait_for(driver, lambda d: "submitted" in text_of(d, "#batch-status"), "the batch to be submitted")
    wait_for(
        driver,
        lambda d: all_by(d, "#batches tr[data-status='completed'] [data-action='download-output']"),
        "completion",
        timeout=180,
    )
    done = "#batches tr[data-status='completed']"
    wait_for(driver, lambda d: "4/4" in text_of(d, done) and "(1 failed)" in text_of(d, done), "4/4 done, 1 failed")
    assert text_of(driver, f"{done} .metadata") == f"description: {HOSTILE_NAME}"  # as text: no <img> was made
    assert not all_by(driver, "#batches img")
    shot(c, "batches")
    batch_id = wait_for(driver, lambda d: by(d, done).get_attribute("data-batch"), "the batch id")
    wait_for(driver, lambda d: by(d, f"{done} [data-action='download-output']").click() or True, "the download click")
    target = c["downloads"] / f"{batch_id}-output.jsonl"
    wait_for(driver, lambda d: target.exists() and target.stat().st_size > 0, "the downloaded output")
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert sorted(o["custom_id"] for o in out) == ["q0", "q1", "q2"]
    assert all(o["response"]["status_code"] == 200 for o in out)
    by(driver, f"{done} [data-action='download-errors']").click()
    errors_file = c["downloads"] / f"{batch_id}-errors.jsonl"
    wait_for(driver, lambda d: errors_file.exists() and errors_file.stat().st_size > 0, "the downloaded errors")
    [failed] = [json.loads(line) for line in errors_file.read_text().splitlines()]
    assert failed["custom_id"] == "bad" and "no-such-model" in json.dumps(failed)

    # a long batch cancelled from its row: the lines not finished stop
    by(driver, "#batch-lines").send_keys(
        "\n".join(
            json.dumps({**lines[0], "custom_id": f"long{i}", "body": {**lines[0]["body"], "max_tokens": 200}})
            for i in range(24)
        )
    )
    by(driver, "#batch-submit").click()
    running = "#batches tr:not([data-status='completed']) [data-action='cancel']"
    wait_for(driver, lambda d: all_by(d, running), "the new batch with its cancel button")
    wait_for(driver, lambda d: by(d, running).click() or True, "the cancel click")
    wait_for(driver, lambda d: "cancelled" in text_of(d, "#download-status"), "the cancellation")
    wait_for(driver, lambda d: all_by(d, "#batches tr[data-status='cancelled']"), "the batch cancelled", timeout=120)
    assert_clean(driver)


def test_playground_shows_json_schema_header_grounding_and_confidence(console: dict[str, Any]) -> None:
    c = console
    driver = sign_in(c)
    wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "signed in")
    driver.get(f"{c['server'].url}/console/#/playground")
    wait_for(driver, lambda d: all_by(d, "#pg-form"), "the playground")
    from selenium.webdriver.support.ui import Select

    Select(by(driver, "#pg-model")).select_by_value(c["engine"].model_name)
    by(driver, "#pg-send").click()
    wait_for(driver, lambda d: all_by(d, "#pg-json"), "the answer", timeout=180)
    answer = json.loads(by(driver, "#pg-json").text)
    message = by(driver, "#pg-user").get_attribute("value")
    assert set(answer) == {"name", "urgent"} and isinstance(answer["urgent"], bool)
    assert answer["name"] in message  # grounded: a verbatim span of the message
    assert by(driver, "#pg-schema-header").text in {"exact", "narrowed"}
    marks = all_by(driver, "#grounded-source mark[data-pointer='/name']")
    assert [m.text for m in marks] == [answer["name"]]
    assert by(driver, "#grounded-source").text == message
    pointers = {r.get_attribute("data-pointer") for r in all_by(driver, "#pg-field-logprobs-table tr[data-pointer]")}
    assert pointers == {"/name", "/urgent"}
    shot(c, "playground")
    assert_clean(driver)


def test_playground_on_an_endpoint_with_its_own_schema(console: dict[str, Any]) -> None:
    c = console
    url, key = c["server"].url, c["key"]
    schema = {
        "type": "object",
        # (no x-loraplex-grounded: an endpoint's schema is compiled at publish, without a request's source text)
        "properties": {"person": {"type": "string", "maxLength": 40}, "angry": {"type": "boolean"}},
        "required": ["person", "angry"],
        "additionalProperties": False,
    }
    r = httpx.post(
        f"{url}/v1/endpoints",
        json={
            "name": "triage",
            "defaults": {
                "system_prompt": "Extract who wrote the ticket and whether they are angry.",
                "response_format": {"type": "json_schema", "json_schema": {"name": "triage", "schema": schema}},
                "temperature": 0,
                "max_tokens": 40,
            },
        },
        headers=auth(key),
    )
    assert r.status_code == 201, r.text
    driver = sign_in(c)
    wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "signed in")
    driver.get(f"{url}/console/#/playground")
    wait_for(driver, lambda d: all_by(d, "#pg-form"), "the playground")
    from selenium.webdriver.support.ui import Select

    Select(by(driver, "#pg-model")).select_by_value(f"{TENANT}/triage")
    # sending what the endpoint fixes is refused by name, and the console says so
    by(driver, "#pg-send").click()
    wait_for(driver, lambda d: "override_not_allowed" in text_of(d, "#pg-status"), "the refusal")
    by(driver, "#pg-send-schema").click()  # the endpoint's own schema
    by(driver, "#pg-max-tokens").clear()
    by(driver, "#pg-temperature").clear()
    by(driver, "#pg-send").click()
    wait_for(driver, lambda d: all_by(d, "#pg-json"), "the answer", timeout=180)
    answer = json.loads(by(driver, "#pg-json").text)
    assert set(answer) == {"person", "angry"} and len(answer["person"]) <= 40
    assert text_of(driver, "#pg-status") == "Answered by base"  # an endpoint on the base model says so
    assert {r.get_attribute("data-pointer") for r in all_by(driver, "#pg-field-logprobs-table tr[data-pointer]")} == {
        "/person",
        "/angry",
    }
    assert not all_by(driver, "#grounded-source") and "No grounded values." in text_of(driver, "#pg-result")
    assert text_of(driver, "#pg-schema-header") == "exact"
    assert_clean(driver)


def test_hostile_strings_render_as_text(console: dict[str, Any]) -> None:
    c = console
    url, key = c["server"].url, c["key"]
    driver = sign_in(c)
    wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "signed in")
    # an endpoint whose description and system prompt are markup, made through the console's own form
    driver.get(f"{url}/console/#/endpoints")
    wait_for(driver, lambda d: all_by(d, "#create-endpoint"), "the endpoint form")
    by(driver, "#ep-name").send_keys("hostile")
    by(driver, "#ep-description").send_keys(HOSTILE_DESCRIPTION)
    by(driver, "#ep-system").send_keys(HOSTILE_PROMPT)
    by(driver, "#create-button").click()
    wait_for(driver, lambda d: text_of(d, "#create-status") == "Endpoint hostile created", "the endpoint made")
    stored = httpx.get(f"{url}/v1/endpoints/hostile", headers=auth(key)).json()
    assert (stored["description"], stored["defaults"]["system_prompt"]) == (HOSTILE_DESCRIPTION, HOSTILE_PROMPT)
    driver.get(f"{url}/console/#/adapters")
    wait_for(driver, lambda d: all_by(d, "#upload-form"), "the adapters page")
    # an adapter named like an <img>: refused by the name rules, and the refusal quoting it is shown as text
    by(driver, "#upload-name").send_keys(HOSTILE_NAME)
    by(driver, "#upload-file").send_keys(str(c["zips"][0]))
    by(driver, "#upload-button").click()
    wait_for(driver, lambda d: "invalid" in text_of(d, "#upload-status"), "the name refusal")
    assert HOSTILE_NAME in text_of(driver, "#upload-status")
    assert not all_by(driver, "#page img")
    driver.get(f"{url}/console/#/endpoints")
    wait_for(driver, lambda d: all_by(d, "#endpoints tr[data-endpoint='hostile']"), "the endpoint list")
    assert by(driver, "#endpoints tr[data-endpoint='hostile'] .description").text == HOSTILE_DESCRIPTION
    assert by(driver, "#endpoints tr[data-endpoint='hostile'] .system-prompt").text == HOSTILE_PROMPT
    driver.get(f"{url}/console/#/endpoints/hostile")
    wait_for(driver, lambda d: text_of(d, "#system-prompt") == HOSTILE_PROMPT, "the endpoint's system prompt")
    assert text_of(driver, "#description") == HOSTILE_DESCRIPTION
    assert not all_by(driver, "#page script") and not all_by(driver, "#page b")
    shot(c, "hostile")
    assert_clean(driver)
    # the counter counts: an image from another origin is a violation of img-src
    driver.execute_script("const i = new Image(); i.src = 'http://127.0.0.2:9/x.png'; document.body.append(i);")
    wait_for(driver, lambda d: d.execute_script("return window.__cspViolations") == 1, "the violation to be counted")


def test_keys_created_revoked_and_this_tabs_key_rotated(console: dict[str, Any]) -> None:
    c = console
    url = c["server"].url
    made = httpx.post(f"{url}/v1/tenants/{TENANT}/keys", headers=auth(c["key"]))
    assert made.status_code in (200, 201), made.text
    tab_key, tab_prefix = made.json()["key"], made.json()["prefix"]
    driver = sign_in(c, key=tab_key)
    wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "signed in")
    driver.get(f"{url}/console/#/keys")
    wait_for(driver, lambda d: "(this tab)" in text_of(d, f"#keys tr[data-prefix='{tab_prefix}']"), "this tab's key")

    by(driver, "#create-key").click()
    wait_for(driver, lambda d: all_by(d, "#new-key-value"), "the new key, shown once")
    extra = by(driver, "#new-key-value").text
    assert httpx.get(f"{url}/v1/adapters", headers=auth(extra)).status_code == 200
    extra_prefix = extra.removeprefix("lpx-").split(".")[0]
    wait_for(driver, lambda d: all_by(d, f"#keys tr[data-prefix='{extra_prefix}'] [data-action='revoke']"), "listed")
    by(driver, f"#keys tr[data-prefix='{extra_prefix}'] [data-action='revoke']").click()
    wait_for(driver, lambda d: f"Key {extra_prefix} revoked" in text_of(d, "#keys-status"), "the revocation")
    assert httpx.get(f"{url}/v1/adapters", headers=auth(extra)).status_code == 401

    by(driver, "#rotate-key").click()
    wait_for(driver, lambda d: f"{tab_prefix} is revoked" in text_of(d, "#keys-status"), "the rotation")
    new_key = driver.execute_script("return sessionStorage.getItem('loraplex.key')")
    assert new_key != tab_key and new_key not in driver.execute_script("return JSON.stringify(localStorage)")
    assert httpx.get(f"{url}/v1/adapters", headers=auth(tab_key)).status_code == 401
    assert httpx.get(f"{url}/v1/adapters", headers=auth(new_key)).status_code == 200
    assert httpx.get(f"{url}/v1/adapters", headers=auth(c["key"])).status_code == 200  # other keys untouched
    driver.get(f"{url}/console/#/adapters")  # the tab goes on with its new key
    wait_for(driver, lambda d: all_by(d, "#upload-form"), "the adapters page with the rotated key")
    shot(c, "keys")
    assert_clean(driver)


def test_usage_against_limits(console: dict[str, Any]) -> None:
    c = console
    driver = sign_in(c)
    wait_for(driver, lambda d: d.find_element("id", "nav").is_displayed(), "signed in")
    driver.get(f"{c['server'].url}/console/#/usage")
    wait_for(driver, lambda d: all_by(d, "#usage tr[data-usage='queued_requests']"), "the usage table")
    row = "#usage tr[data-usage='tokens_this_minute']"
    wait_for(driver, lambda d: text_of(d, f"{row} .limit") == "unlimited", "no token limit shown")
    wait_for(driver, lambda d: text_of(d, f"{row} .use").isdigit(), "the tokens used this minute")
    shot(c, "usage")
    assert_clean(driver)
