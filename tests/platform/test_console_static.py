"""The web console's static files at /console: served by the app with a strict Content-Security-Policy on every
response, JavaScript modules with a JavaScript type, no inline script or style in the page, and no script that
turns a string into HTML (the browser tests in test_console_browser.py drive the pages themselves)."""

from __future__ import annotations

import re
import shutil

import httpx
import pytest

from loraplex.platform.console import CONTENT_SECURITY_POLICY, STATIC_DIR

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def test_every_console_file_is_served_with_the_policy(start_server) -> None:
    assert CONTENT_SECURITY_POLICY == CSP
    server = start_server()
    files = sorted(p.relative_to(STATIC_DIR).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file())
    assert {"index.html", "app.js", "app.css", "api.js", "dom.js", "plot.js"} <= set(files)
    for path in ["", "/", *(f"/{f}" for f in files)]:
        r = httpx.get(f"{server.url}/console{path}")
        assert r.status_code == 200, (path, r.status_code)
        assert r.headers["content-security-policy"] == CSP, path
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        kind = r.headers["content-type"].split(";")[0]
        suffix = path.rsplit(".", 1)[-1] if "." in path else "html"
        assert kind == {"html": "text/html", "js": "text/javascript", "css": "text/css"}[suffix], (path, kind)
    assert httpx.get(f"{server.url}/console/").text == (STATIC_DIR / "index.html").read_text()
    # nothing outside the folder, and the console is no API route: it is absent from the OpenAPI document
    assert httpx.get(f"{server.url}/console/../settings.py").status_code == 404
    missing = httpx.get(f"{server.url}/console/no-such-page.js")
    assert missing.status_code == 404 and missing.headers["content-security-policy"] == CSP
    assert missing.headers["x-frame-options"] == "DENY"
    assert httpx.get(f"{server.url}/console/%2e%2e/__init__.py").status_code == 404
    paths = httpx.get(f"{server.url}/schema/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/console")]


def test_the_page_and_scripts_never_build_html_from_strings() -> None:
    page = (STATIC_DIR / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "inline script"
    assert not re.search(r"<style|\sstyle=|\son[a-z]+=", page), "inline style or event handler"
    scripts = {p.name: p.read_text() for p in STATIC_DIR.rglob("*.js")}
    banned = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|localStorage")
    found = {name: banned.findall(text) for name, text in scripts.items() if banned.search(text)}
    assert not found, found
    assert "sessionStorage" in scripts["api.js"]  # the key lives in the tab's session storage only


def test_a_missing_browser_skips_saying_why_but_fails_under_ci(monkeypatch, tmp_path) -> None:
    from tests.platform import browser

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(browser, "CHROMEDRIVER", str(tmp_path / "no-chromedriver"))
    monkeypatch.setattr(browser, "CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="chromium and chromedriver not installed"):
        browser.require_browser()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="need a browser under CI"):
        browser.require_browser()
