"""The documentation site (mkdocs.yml, docs/) builds with --strict, and what it generates is complete: every route
and method of the server's OpenAPI document, every error code of platform/error_codes.py, every `loraplex`
command and flag, every Prometheus metric and every environment variable is in the built reference; a broken
link or anchor in the README (the front page) or in a page fails the build; and the build refuses to run with
the checkout's root on sys.path."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from loraplex.platform.app import create_app
from loraplex.platform.cli import build_parser
from loraplex.platform.error_codes import CODES
from loraplex.platform.settings import Settings

REPO = Path(__file__).resolve().parents[1]


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _reference()


def build(root: Path, site: Path, *, safe_path: bool = True) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the checkout (or a copy of it) at `root` into `site`."""
    python = [sys.executable, "-P"] if safe_path else [sys.executable]
    return subprocess.run(
        [*python, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(REPO, out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_every_route_of_the_openapi_document_is_in_the_api_reference(site: Path) -> None:
    doc = create_app(Settings()).openapi_schema.to_schema()
    found = ids(site / "api" / "index.html")
    routes = [(method, path) for method, path, _ in reference.operations(doc)]
    assert len(routes) > 40  # the document is the whole app's, not an empty one
    missing = [f"{m.upper()} {path}" for m, path in routes if reference.route_anchor(m, path) not in found]
    assert not missing, f"routes missing from the API reference: {missing}"
    schemas = [name for name in doc["components"]["schemas"] if reference.schema_anchor(name) not in found]
    assert not schemas, f"schemas missing from the API reference: {schemas}"
    assert (site / "openapi.json").is_file()


def test_every_error_code_is_on_the_errors_page(site: Path) -> None:
    found = ids(site / "errors" / "index.html")
    missing = sorted(code for code in CODES if code not in found)
    assert not missing, f"error codes missing from the errors page: {missing}"


def test_every_cli_command_and_flag_is_in_the_cli_reference(site: Path) -> None:
    page = site / "cli" / "index.html"
    found, text = ids(page), page.read_text(encoding="utf-8")
    commands = list(reference.commands(build_parser()))
    assert {("loraplex", "serve"), ("loraplex", "adapters", "push"), ("loraplex", "batch", "submit")} <= {
        path for path, _, _ in commands
    }
    missing = [" ".join(path) for path, _, _ in commands if reference.command_anchor(path) not in found]
    assert not missing, f"commands missing from the CLI reference: {missing}"
    flags = {
        flag
        for _, _, parser in commands
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)  # -h is in each usage line, not in the tables
        for flag in action.option_strings
    }
    assert "--max-num-seqs" in flags
    absent = sorted(flag for flag in flags if f"<code>{flag}" not in text and f" {flag}" not in text)
    assert not absent, f"flags missing from the CLI reference: {absent}"


def test_every_metric_is_in_the_metrics_reference(site: Path) -> None:
    from loraplex.engine.stats import EngineStats
    from loraplex.platform.metrics import Metrics

    text = (site / "operations" / "index.html").read_text(encoding="utf-8")
    metrics = list(Metrics(EngineStats, lambda names: names, block_size=16).registry.collect())
    names = [reference.exposed_name(metric.name, metric.type) for metric in metrics]
    assert {"loraplex_requests_total", "vllm:lora_requests_info", "loraplex_endpoint_requests_total"} <= set(names)
    missing = [name for name in names if f"<code>{name}</code>" not in text]
    assert not missing, f"metrics missing from the metrics reference: {missing}"


def test_every_environment_variable_is_on_its_page(site: Path) -> None:
    from loraplex.envvars import VARIABLES
    from loraplex.platform.settings import Settings, engine_arg_specs

    text = (site / "environment" / "index.html").read_text(encoding="utf-8")
    names = [v.name for v in VARIABLES] + [f"LORAPLEX_{f.name.upper()}" for f in dataclasses.fields(Settings)]
    names += [spec.env for spec in engine_arg_specs()]
    names.remove("LORAPLEX_ENGINE_ARGS")  # the engine arguments' holder, each of them has its own
    assert {"LORAPLEX_CACHE_DIR", "LORAPLEX_REDIS_URL", "LORAPLEX_MAX_NUM_SEQS"} <= set(names)
    missing = [name for name in names if f"<code>{name.replace('<', '&lt;').replace('>', '&gt;')}</code>" not in text]
    assert not missing, f"variables missing from the environment page: {missing}"


def test_the_readme_is_the_front_page_with_its_links_into_the_site(site: Path) -> None:
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "A first request" in index and "localhost:8000/v1/tenants" in index
    assert 'href="setup/"' in index and 'href="api/"' in index  # docs/setup.md and docs/api.md, as site pages
    assert 'href="docs/' not in index


def _copy_of_the_sources(to: Path) -> Path:
    to.mkdir()
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(REPO / name, to / name)
    shutil.copytree(REPO / "docs", to / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    (to / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "error_table.py", to / "scripts" / "error_table.py")
    return to


def test_a_broken_link_or_anchor_in_the_readme_or_a_page_fails_the_build(tmp_path: Path) -> None:
    root = _copy_of_the_sources(tmp_path / "src")
    with (root / "README.md").open("a", encoding="utf-8") as readme:
        readme.write("\nSee [the old page](docs/no-such-page.md).\n")
    with (root / "docs" / "batch.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [a code that is not](errors.md#no_such_code).\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "no_such_code" in done.stderr, done.stderr[-4000:]


def test_the_build_refuses_to_run_with_the_checkout_on_sys_path(tmp_path: Path) -> None:
    done = build(REPO, tmp_path / "site", safe_path=False)  # `python -m mkdocs` from the root puts it on sys.path
    assert done.returncode != 0
    assert "is on sys.path" in done.stderr + done.stdout and "mkdocs build --strict" in done.stderr + done.stdout
    assert not (tmp_path / "site" / "index.html").exists()


def test_free_text_from_the_code_is_escaped_outside_code_spans() -> None:
    assert reference.text("Bearer <metrics_token> or `<key>`") == "Bearer &lt;metrics_token> or `<key>`"
    assert reference._cell("a | b\n  c") == "a \\| b c"  # one line, its pipes kept out of the table's columns


def test_schema_types_read_as_words_with_links_to_schemas() -> None:
    nullable = {"oneOf": [{"$ref": "#/components/schemas/Canary"}, {"type": "null"}]}
    assert reference.type_of(nullable) == "[Canary](#schema-canary) or null"
    assert reference.type_of({"type": "array", "items": {"enum": ["a", 1]}}) == 'array of `"a"` or `1`'
    assert reference.type_of({"type": "string", "format": "binary"}) == "string (binary)"
    rows = reference.fields_table({"properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]})
    assert rows[2] == "| `n` | integer | yes | min `1` |"
