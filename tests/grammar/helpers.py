"""Helpers shared by the grammar tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from loraplex.envvars import schema_suite

REPO = Path(__file__).resolve().parents[2]
EOS = 2  # <|im_end|>
VOCAB = 49152


def suite_path() -> Path:
    """The JSON-Schema-Test-Suite subset: $LORAPLEX_SCHEMA_SUITE, else shared/schemas beside or in the repo."""
    given = schema_suite()
    candidates = [given] if given else []
    candidates += [REPO.parent / "shared" / "schemas" / "suite.jsonl", REPO / "shared" / "schemas" / "suite.jsonl"]
    for cand in candidates:
        if cand.is_file():
            return cand
    raise FileNotFoundError("suite.jsonl not found: set LORAPLEX_SCHEMA_SUITE to its path")


def load_suite() -> list[dict]:
    return [json.loads(line) for line in suite_path().read_text().splitlines() if line.strip()]


def feed(matcher, token_ids: list[int]) -> bool:
    """Feed tokens; True if every one was accepted."""
    return all(matcher.accept_token(t) for t in token_ids)


def allowed_ids(mask) -> list[int]:
    """Token ids whose bit is set in an int32 bitmask row."""
    import torch

    bits = (mask.unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return torch.nonzero(bits.flatten()).flatten().tolist()


def walks_validate(
    compiler, schema: dict, grammar, seed: str | int, walks: int = 8, budget: int | None = None
) -> list[str]:
    """Random walks through the masks (``budget`` tokens each, default min_tokens + 100, at least 200): every
    walk must close and its document validate against ``schema`` (2020-12, formats asserted)."""
    import jsonschema

    from loraplex.grammar.fuzz import random_walk

    check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    rng = random.Random(seed)
    texts = []
    for _ in range(walks):
        walk = random_walk(grammar, compiler.vocab, rng, budget or max(200, grammar.min_tokens + 100))
        assert walk.error is None, walk.error
        assert walk.closed, walk.text
        errors = [e.message for e in check.iter_errors(json.loads(walk.text))]
        assert not errors, f"{walk.text!r:.300}: {errors[:2]}"
        texts.append(walk.text)
    return texts


NUMBER_BOUND = "no bound given: values are kept"  # how narrow.py reports the ±10^16 bound on an unbounded number
FRACTION_CAP = "number: a fraction is written with at most 17 digits"  # ...and the cap on a number's fraction


def besides_number_bounds(narrowing) -> list:
    """A narrowing (strings, or narrow()'s Narrowing records) without the ±10^16 bounds and the fraction cap narrow.py
    puts on numbers: tests about other keywords read what remains (test_grammar_number_bounds.py tests those)."""
    return [n for n in narrowing if NUMBER_BOUND not in str(n) and FRACTION_CAP not in str(n)]
