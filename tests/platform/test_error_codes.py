"""The error-code registry (platform/error_codes.py) is the whole truth: every code the source raises is in it,
every code in it is raised somewhere, and the errors page (docs/errors.md, filled in by scripts/error_table.py at build)
has a row for each."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from loraplex.grammar.spec import GRAMMAR_ERROR_CODES
from loraplex.platform.error_codes import CODES, MEANINGS

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("platform", "engine", "adapters", "grammar")
# Where a code is written in the source: a `code=` argument or default, an engine error's `default_code`, a
# `"code":` key, the status -> code table of errors.py, the last argument of error_body/_response, and the
# unrun lines' codes (beside their message) of the batch output.
PATTERNS = (
    r'\bcode(?:: str)?\s*=\s*"([a-z_]+)"',
    r'default_code = "([a-z_]+)"',
    r'"code": "([a-z_]+)"',
    r'^\s+\d{3}: "([a-z_]+)",$',
    r'codes\[\d+\] = "([a-z_]+)"',
    r'error_body\([^()]*"([a-z_]+)"\)',
    r'_response\([^()]*"([a-z_]+)"\)',
    r'\("(batch_[a-z_]+)", "[^"]* [^"]*"\)',
    r'^\s+"[a-z_]+": "([a-z_]+_exceeded)",$',
)
STATUS_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error"}
STATUS_TYPES |= {"conflict_error", "rate_limit_error", "service_unavailable"}  # errors.py's `type` per status


def _raised() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert 'code=f"' not in text, f"{path}: a code is a registered literal, not an f-string"
            for pattern in PATTERNS:
                for match in re.finditer(pattern, text, re.M):
                    found.setdefault(match[1], set()).add(str(path.relative_to(REPO)))
    for code in GRAMMAR_ERROR_CODES:
        found.setdefault(code, set()).add("grammar/spec.py")
    for code in STATUS_TYPES:  # the status -> type table is matched by the same pattern; types are not codes
        found.pop(code, None)
    return found


def test_every_raised_code_is_registered() -> None:
    unknown = {code: sorted(paths) for code, paths in _raised().items() if code not in CODES}
    assert not unknown, f"codes raised but not in platform/error_codes.py: {unknown}"


def test_every_registered_code_is_raised_somewhere() -> None:
    stale = sorted(CODES - set(_raised()))
    assert not stale, f"codes in platform/error_codes.py that nothing raises: {stale}"


def test_every_code_has_a_one_line_meaning() -> None:
    assert set(MEANINGS) == CODES
    assert all(meaning and "\n" not in meaning for meaning in MEANINGS.values())


def test_the_errors_page_gets_a_row_and_an_anchor_for_every_code() -> None:
    spec = importlib.util.spec_from_file_location("error_table", REPO / "scripts" / "error_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.with_table((REPO / "docs" / "errors.md").read_text(encoding="utf-8"))
    for code, meaning in MEANINGS.items():
        assert f'| <span id="{code}"></span>`{code}` | {meaning} |' in text, code
