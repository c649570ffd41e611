"""Look-arounds in schema patterns become ordinary regexes for the whole string, exactly.

The oracle is Python's `regex` module searching the pattern itself (look-arounds and all); on ASCII its
meaning of \\d, \\w and `.` is ECMA's. Every string up to length 4 over an alphabet drawn from the pattern,
plus random longer ones, must get the same answer from the rewritten regex (a full match) as from the search.
"""

from __future__ import annotations

import itertools
import json
import random
import re

import jsonschema
import pytest
import regex

from loraplex.grammar import GrammarError, StructuredSpec
from loraplex.grammar.fuzz import random_walk
from loraplex.grammar.schema.ecma_pattern import pattern_to_rust

PATTERNS = [
    # SchemaStore development set
    r"^(?=[A-Z])[a-zA-Z0-9.,;()\s]*[^.,;!?: \W]$",
    r"^(?!relationships$|links$)\w[-\w_]*$",
    r"^(?!io\.papermc\.)([a-zA-Z_$][a-zA-Z\d_$]*\.)*[a-zA-Z_$][a-zA-Z\d_$]*$",
    r"^(?!\.{1,2}$)(?!.*\/)[a-zA-Z0-9\-\._]+$",
    r"^(?!\.)(?!\./).+",
    r"^(?!@@)[\w@]+$",
    # common shapes
    r"^(?=.{1,12}$)[a-z0-9-]+$",
    r"^(?!-)[a-z0-9-]+(?<!-)$",
    r"(?<=a)b",
    r"(?<!x)y$",
    r"foo(?!bar)",
    r"^a(?!\d{2}$)\d+$",
    r"(?=a|b$)[a-c]+",
    r"^x(?=y(?!z))",
    # bodies that repeat without bound: solved as an automaton
    r"^(?=.*[A-Z])(?=.*\d).{4,}$",
    r"^(?!.*--)[a-z-]+$",
    r"(?=\w*7)a",
]
# what each refusal says
REFUSED = [
    (r"^(?=.*a)(?=.*b)(?=.*c)(?=.*d)(?=.*e)(?=.*f)(?=.*g)(?=.*h).{8,64}$", "too large to enforce"),
    (r"^(?:(?!ab)[a-c])+$", "inside a quantified group"),
    (r"a(?<=a)(?=b)b", "look-aheads and look-behinds"),
    (r"(?=a)*b", "quantified look-around"),
    (r"^(?!\p{Lu})\w+$", "Unicode property classes"),
    (r"^(?=a)(?!a)", "leave no string"),
]


def _alphabet(pattern: str) -> list[str]:
    letters = {c for c in pattern if c.isprintable() and c not in "^$()[]{}?*+|\\!=<:"}
    return sorted(letters | {"a", "Z", "7", "-", ".", " ", "_", "@", "/", "#"})


def _rust_to_python(rx: str) -> str:
    return re.sub(r"\\x\{([0-9A-Fa-f]+)\}", lambda m: f"\\U{int(m[1], 16):08x}", rx)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_rewrite_agrees_with_a_search_of_the_pattern(pattern):
    full = regex.compile(_rust_to_python(pattern_to_rust(pattern)))
    search = regex.compile(pattern)
    alphabet = _alphabet(pattern)
    strings = ["".join(t) for n in range(5) for t in itertools.product(alphabet[:9], repeat=n)]
    rng = random.Random(pattern)
    strings += ["".join(rng.choice(alphabet) for _ in range(rng.randint(5, 16))) for _ in range(3000)]
    wrong = [s for s in strings if (full.fullmatch(s) is not None) != (search.search(s) is not None)]
    assert not wrong, f"{len(wrong)} strings disagree, e.g. {wrong[:5]}"


@pytest.mark.parametrize("pattern, message", REFUSED)
def test_what_cannot_be_enforced_is_refused_by_name(pattern, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        pattern_to_rust(pattern)


@pytest.mark.parametrize("pattern", PATTERNS[:10])
def test_schema_with_a_lookaround_pattern_generates_only_matches(compiler, pattern):
    """End to end through the grammar compiler (JSON string content, escapes and all): exact, and every random
    walk is a JSON string the pattern matches."""
    schema = {"type": "string", "pattern": pattern, "maxLength": 24}
    grammar = compiler.compile(StructuredSpec(json=schema, allow_narrowing=False))
    check = jsonschema.Draft202012Validator(schema)
    rng = random.Random(pattern)
    for _ in range(20):
        walk = random_walk(grammar, compiler.vocab, rng, 64)
        assert walk.error is None and walk.closed, walk
        assert check.is_valid(json.loads(walk.text)), walk.text
