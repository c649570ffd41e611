"""Headless Chromium for the web console's tests: Debian's chromium and chromedriver driven by Selenium, with a
fresh profile, downloads into a folder, and a counter of Content-Security-Policy violations installed in every
page before its own scripts run. Missing browser: a skip naming why, but a failure under CI (CI=true)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.ci import on_ci

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Without the background-networking flags Chromium dials out at start and this machine's closed network refuses it.
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1400",
]
# Counts securitypolicyviolation events into window.__cspViolations (and keeps what they were), from the start of
# every document: a policy that blocks something the console does shows here even when nothing else breaks.
CSP_COUNTER = """
window.__cspViolations = 0;
window.__cspReports = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations += 1;
  window.__cspReports.push(e.violatedDirective + " " + e.blockedURI);
});
"""


def require_browser() -> tuple[str, str]:
    """Chromium and chromedriver's paths; a skip naming what is missing (a failure under CI)."""
    found = {
        name: shutil.which(name) or (path if Path(path).exists() else None)
        for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER))
    }
    missing = [name for name, path in found.items() if path is None]
    if missing:
        why = f"{' and '.join(missing)} not installed (apt-get install chromium chromium-driver; .ci/run does)"
        if on_ci():
            pytest.fail(f"the console's browser tests need a browser under CI: {why}")
        pytest.skip(why)
    return found["chromium"], found["chromedriver"]  # type: ignore[return-value]


def start_chromium(profile: Path, downloads: Path) -> Any:
    """A headless Chromium session (selenium WebDriver) with `profile` as its fresh user-data-dir."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_COUNTER})
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    return driver


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str, timeout: float = 60.0) -> Any:
    """Wait until `condition(driver)` is truthy; past the timeout fail naming `what` (with the page's text)."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:  # (a list re-rendered while the condition read it is read again at the next poll)
        wait = WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
        return wait.until(condition)
    except TimeoutException:
        body = driver.execute_script("return document.body ? document.body.innerText : ''")
        raise AssertionError(f"timed out waiting for {what}; the page says:\n{body[-2000:]}") from None
