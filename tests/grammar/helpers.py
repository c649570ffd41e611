"""Helpers shared by the grammar tests."""

from __future__ import annotations

import json
from pathlib import Path

from loraplex.env import schema_suite

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
